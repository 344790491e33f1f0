package idemrpc

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"math"
	"slices"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
)

// Fingerprint returns the fingerprint of a call of fullMethod with the
// request m: SHA-256 over the method and a canonical walk of the message.
//
// Protobuf's wire encoding is not canonical: the same message may be
// written with its fields in another order, with unknown fields a newer
// schema added, with packed or unpacked repeated scalars, and the Go
// library's deterministic mode still changes with the schema and the
// library's version. Hashing wire bytes would make a genuine retry sent
// by a client built from another revision of the schema "another
// request". The walk reads the message through protoreflect instead:
// each populated field by number (names may change, numbers may not),
// in number order, with map entries sorted by key, unknown fields left
// out, floating-point zero and NaN written one way each, and a
// google.protobuf.Any walked as the message it holds when its type is
// registered.
func Fingerprint(fullMethod string, m proto.Message) []byte {
	h := sha256.New()
	writeString(h, fullMethod)
	if m != nil {
		walkMessage(h, m.ProtoReflect())
	}
	return h.Sum(nil)
}

var anyName = (&anypb.Any{}).ProtoReflect().Descriptor().FullName()

func walkMessage(h hash.Hash, m protoreflect.Message) {
	if !m.IsValid() {
		writeUint(h, 0)
		return
	}
	if m.Descriptor().FullName() == anyName {
		if inner, ok := unpackAny(m); ok {
			writeUint(h, 'A')
			writeString(h, string(inner.Descriptor().FullName()))
			walkMessage(h, inner)
			return
		}
	}
	type entry struct {
		fd protoreflect.FieldDescriptor
		v  protoreflect.Value
	}
	var fields []entry
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		fields = append(fields, entry{fd, v})
		return true
	})
	slices.SortFunc(fields, func(a, b entry) int { return int(a.fd.Number()) - int(b.fd.Number()) })
	writeUint(h, 'M')
	writeUint(h, uint64(len(fields)))
	for _, f := range fields {
		writeUint(h, uint64(f.fd.Number()))
		switch {
		case f.fd.IsList():
			l := f.v.List()
			writeUint(h, 'L')
			writeUint(h, uint64(l.Len()))
			for i := 0; i < l.Len(); i++ {
				walkValue(h, f.fd, l.Get(i))
			}
		case f.fd.IsMap():
			walkMap(h, f.fd, f.v.Map())
		default:
			walkValue(h, f.fd, f.v)
		}
	}
}

// unpackAny returns the message an Any holds, when its type is
// registered and its bytes parse.
func unpackAny(m protoreflect.Message) (protoreflect.Message, bool) {
	fields := m.Descriptor().Fields()
	url := m.Get(fields.ByNumber(1)).String()
	value := m.Get(fields.ByNumber(2)).Bytes()
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(url)
	if err != nil {
		return nil, false
	}
	inner := mt.New()
	if err := proto.Unmarshal(value, inner.Interface()); err != nil {
		return nil, false
	}
	return inner, true
}

func walkMap(h hash.Hash, fd protoreflect.FieldDescriptor, mp protoreflect.Map) {
	type entry struct {
		key []byte // the key's canonical bytes, to sort on
		v   protoreflect.Value
	}
	var entries []entry
	mp.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
		var b bytes.Buffer
		walkValue(hashWriter{&b}, fd.MapKey(), k.Value())
		entries = append(entries, entry{b.Bytes(), v})
		return true
	})
	slices.SortFunc(entries, func(a, b entry) int { return bytes.Compare(a.key, b.key) })
	writeUint(h, 'P')
	writeUint(h, uint64(len(entries)))
	for _, e := range entries {
		h.Write(e.key)
		walkValue(h, fd.MapValue(), e.v)
	}
}

// hashWriter lets walkValue write a map key into a buffer.
type hashWriter struct{ *bytes.Buffer }

func (hashWriter) Sum([]byte) []byte { return nil }
func (hashWriter) Size() int         { return 0 }
func (hashWriter) BlockSize() int    { return 1 }

func walkValue(h hash.Hash, fd protoreflect.FieldDescriptor, v protoreflect.Value) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		if v.Bool() {
			writeUint(h, 1)
		} else {
			writeUint(h, 0)
		}
	case protoreflect.EnumKind:
		writeUint(h, uint64(int64(v.Enum())))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		// One encoding for every signed width: a field widened from
		// int32 to int64 (a compatible change) keeps its fingerprint.
		writeUint(h, uint64(v.Int()))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		writeUint(h, v.Uint())
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		f := v.Float()
		switch {
		case f == 0:
			f = 0 // -0 and +0 are one value
		case math.IsNaN(f):
			f = math.NaN()
		}
		writeUint(h, math.Float64bits(f))
	case protoreflect.StringKind:
		writeString(h, v.String())
	case protoreflect.BytesKind:
		writeString(h, string(v.Bytes()))
	case protoreflect.MessageKind, protoreflect.GroupKind:
		walkMessage(h, v.Message())
	}
}

func writeUint(h hash.Hash, n uint64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	h.Write(b[:])
}

// writeString writes s with its length first, so that two fields can
// never be read as one.
func writeString(h hash.Hash, s string) {
	writeUint(h, uint64(len(s)))
	h.Write([]byte(s))
}
