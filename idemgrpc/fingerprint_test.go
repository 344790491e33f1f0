package idemgrpc_test

import (
	"bytes"
	"testing"

	"github.com/idem-go/idem/idemgrpc/idemrpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// orderSchema builds the message CreateOrderRequest of a schema; v2 is
// the same schema re-generated after a compatible change: fields renamed
// and declared in another order, a field added.
func orderSchema(t *testing.T, v2 bool) protoreflect.MessageDescriptor {
	t.Helper()
	str, i64 := descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(), descriptorpb.FieldDescriptorProto_TYPE_INT64.Enum()
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	fields := []*descriptorpb.FieldDescriptorProto{
		{Name: proto.String("cart_id"), Number: proto.Int32(1), Type: str, Label: opt, JsonName: proto.String("cartId")},
		{Name: proto.String("total_cents"), Number: proto.Int32(2), Type: i64, Label: opt, JsonName: proto.String("totalCents")},
	}
	pkg := "fp.v1"
	if v2 {
		pkg = "fp.v2"
		fields = []*descriptorpb.FieldDescriptorProto{
			{Name: proto.String("note"), Number: proto.Int32(3), Type: str, Label: opt, JsonName: proto.String("note")},
			{Name: proto.String("amount"), Number: proto.Int32(2), Type: i64, Label: opt, JsonName: proto.String("amount")},
			{Name: proto.String("cart"), Number: proto.Int32(1), Type: str, Label: opt, JsonName: proto.String("cart")},
		}
	}
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name: proto.String(pkg + "/orders.proto"), Package: proto.String(pkg), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("CreateOrderRequest"), Field: fields}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return fd.Messages().Get(0)
}

func order(md protoreflect.MessageDescriptor, cart string, total int64) *dynamicpb.Message {
	m := dynamicpb.NewMessage(md)
	m.Set(md.Fields().ByNumber(1), protoreflect.ValueOfString(cart))
	m.Set(md.Fields().ByNumber(2), protoreflect.ValueOfInt64(total))
	return m
}

const createOrder = "/idem.demo.v1.OrderService/CreateOrder"

func TestFingerprintSurvivesASchemaRegenerated(t *testing.T) {
	v1, v2 := orderSchema(t, false), orderSchema(t, true)
	a := idemrpc.Fingerprint(createOrder, order(v1, "c1", 1200))
	b := idemrpc.Fingerprint(createOrder, order(v2, "c1", 1200))
	if !bytes.Equal(a, b) {
		t.Fatal("the same request under a re-generated schema (fields renamed, reordered, one added and unset) got another fingerprint")
	}
	if bytes.Equal(a, idemrpc.Fingerprint(createOrder, order(v1, "c1", 1201))) {
		t.Fatal("another total got the same fingerprint")
	}
	if bytes.Equal(a, idemrpc.Fingerprint("/idem.demo.v1.OrderService/Other", order(v1, "c1", 1200))) {
		t.Fatal("another method got the same fingerprint")
	}
	if bytes.Equal(idemrpc.Fingerprint(createOrder, order(v1, "c1", 0)), idemrpc.Fingerprint(createOrder, order(v1, "c", 0))) {
		t.Fatal("another cart got the same fingerprint")
	}
}

func TestFingerprintIgnoresUnknownFieldsAndWireOrder(t *testing.T) {
	v1, v2 := orderSchema(t, false), orderSchema(t, true)
	want := idemrpc.Fingerprint(createOrder, order(v1, "c1", 1200))

	// A newer client sets the field it knows of; the older server reads
	// it as an unknown field.
	newer := order(v2, "c1", 1200)
	newer.Set(v2.Fields().ByNumber(3), protoreflect.ValueOfString("gift"))
	wire, err := proto.Marshal(newer)
	if err != nil {
		t.Fatal(err)
	}
	older := dynamicpb.NewMessage(v1)
	if err := proto.Unmarshal(wire, older); err != nil {
		t.Fatal(err)
	}
	if len(older.GetUnknown()) == 0 {
		t.Fatal("the test's message holds no unknown field")
	}
	if got := idemrpc.Fingerprint(createOrder, older); !bytes.Equal(got, want) {
		t.Fatal("an unknown field changed the fingerprint")
	}

	// The same fields written in the other order: other bytes, one
	// request.
	var reordered []byte
	reordered = protowire.AppendTag(reordered, 2, protowire.VarintType)
	reordered = protowire.AppendVarint(reordered, 1200)
	reordered = protowire.AppendTag(reordered, 1, protowire.BytesType)
	reordered = protowire.AppendString(reordered, "c1")
	var inOrder []byte
	inOrder = protowire.AppendTag(inOrder, 1, protowire.BytesType)
	inOrder = protowire.AppendString(inOrder, "c1")
	inOrder = protowire.AppendTag(inOrder, 2, protowire.VarintType)
	inOrder = protowire.AppendVarint(inOrder, 1200)
	for _, wire := range [][]byte{inOrder, reordered} {
		m := dynamicpb.NewMessage(v1)
		if err := proto.Unmarshal(wire, m); err != nil {
			t.Fatal(err)
		}
		if got := idemrpc.Fingerprint(createOrder, m); !bytes.Equal(got, want) {
			t.Fatalf("the encoding %x changed the fingerprint", wire)
		}
	}
}
