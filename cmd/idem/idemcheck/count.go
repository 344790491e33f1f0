package idemcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// maxCountBytes bounds what is read of the list CountURL answers. The
// list is decoded as a stream, one element at a time, so it is never held
// whole.
const maxCountBytes = 16 << 20

// count fetches CountURL and counts the resources it lists.
func (c *checker) count(ctx context.Context) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.CountURL, nil)
	if err != nil {
		return 0, err
	}
	for name, values := range c.Header {
		if name != "Content-Type" {
			req.Header[name] = values
		}
	}
	resp, err := c.Client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s answered %d", redactURL(c.CountURL), resp.StatusCode)
	}
	// A list may be cut to a page; X-Total-Count, where the API sends it,
	// counts them all.
	if total := resp.Header.Get("X-Total-Count"); total != "" {
		n, err := strconv.Atoi(strings.TrimSpace(total))
		if err != nil || n < 0 {
			return 0, fmt.Errorf("GET %s: X-Total-Count %q is not a count", redactURL(c.CountURL), clip([]byte(total)))
		}
		return n, nil
	}
	lr := &io.LimitedReader{R: resp.Body, N: maxCountBytes}
	n, err := countList(lr)
	if err != nil {
		if lr.N == 0 {
			return 0, fmt.Errorf("GET %s: the list is longer than %d MiB: send X-Total-Count, or narrow the URL", redactURL(c.CountURL), maxCountBytes>>20)
		}
		return 0, fmt.Errorf("GET %s: want a JSON array (or an object with a \"data\" array): %v", redactURL(c.CountURL), err)
	}
	return n, nil
}

// countList counts the elements of a JSON array, or of the "data" array of
// a JSON object, reading r as a stream.
func countList(r io.Reader) (int, error) {
	dec := json.NewDecoder(r)
	tok, err := dec.Token()
	if err != nil {
		return 0, err
	}
	switch tok {
	case json.Delim('['):
		return countElements(dec)
	case json.Delim('{'):
		for dec.More() {
			name, err := dec.Token()
			if err != nil {
				return 0, err
			}
			if name == "data" {
				if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
					return 0, errors.New(`"data" is not an array`)
				}
				return countElements(dec)
			}
			if err := skipValue(dec); err != nil {
				return 0, err
			}
		}
		return 0, errors.New(`no "data" array`)
	}
	return 0, errors.New("neither an array nor an object")
}

// countElements counts the values up to the end of the array whose
// opening bracket dec has just read.
func countElements(dec *json.Decoder) (int, error) {
	n := 0
	for dec.More() {
		if err := skipValue(dec); err != nil {
			return 0, err
		}
		n++
	}
	if _, err := dec.Token(); err != nil { // the closing bracket
		return 0, err
	}
	return n, nil
}

// skipValue reads one value, token by token, keeping none of it.
func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('['), json.Delim('{'):
			depth++
		case json.Delim(']'), json.Delim('}'):
			depth--
		}
		if depth == 0 {
			return nil
		}
	}
}
