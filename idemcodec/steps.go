package idemcodec

import (
	"encoding/binary"
	"fmt"

	"github.com/idem-go/idem"
)

// MarshalSteps encodes steps in the canonical form stores keep: for each
// step, its name and its value, each as a uvarint length and its bytes.
// The encoding of a list is the concatenation of the encodings of its
// elements, so a store appends a step with a plain concatenation
// (SQL ||, CONCAT, Redis APPEND). Empty or nil steps encode as nil.
func MarshalSteps(steps []idem.RecordedStep) []byte {
	var out []byte
	for _, s := range steps {
		out = AppendStep(out, s.Name, s.Value)
	}
	return out
}

// AppendStep appends the encoding of one step to b and returns it.
func AppendStep(b []byte, name string, value []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(name)))
	b = append(b, name...)
	b = binary.AppendUvarint(b, uint64(len(value)))
	return append(b, value...)
}

// UnmarshalSteps decodes what MarshalSteps encoded. A name recorded twice
// keeps its first value. It never keeps b: the values are copies.
func UnmarshalSteps(b []byte) ([]idem.RecordedStep, error) {
	var steps []idem.RecordedStep
	seen := map[string]bool{}
	for len(b) > 0 {
		name, rest, err := cutField(b)
		if err != nil {
			return nil, err
		}
		value, rest, err := cutField(rest)
		if err != nil {
			return nil, err
		}
		b = rest
		if seen[string(name)] {
			continue
		}
		seen[string(name)] = true
		steps = append(steps, idem.RecordedStep{Name: string(name), Value: append([]byte{}, value...)})
	}
	return steps, nil
}

func cutField(b []byte) (field, rest []byte, err error) {
	n, size := binary.Uvarint(b)
	if size <= 0 || n > uint64(len(b)-size) {
		return nil, nil, fmt.Errorf("idem: malformed recorded steps (%d bytes left)", len(b))
	}
	end := size + int(n)
	return b[size:end], b[end:], nil
}
