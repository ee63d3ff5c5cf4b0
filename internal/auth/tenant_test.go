package auth

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tabuladb/tabula/api"
)

// tenantPaths lists the paths of every "tenant" string field md can hold.
func tenantPaths(md protoreflect.MessageDescriptor, prefix string, depth int) []string {
	if depth > maxTenantDepth {
		return nil
	}
	var out []string
	fs := md.Fields()
	for i := range fs.Len() {
		f := fs.Get(i)
		switch {
		case f.Name() == "tenant" && f.Kind() == protoreflect.StringKind:
			out = append(out, prefix+"tenant")
		case f.Kind() == protoreflect.MessageKind && !f.IsMap():
			out = append(out, tenantPaths(f.Message(), prefix+string(f.Name())+".", depth+1)...)
		}
	}
	return out
}

// TestPointTenantFields: checkPointTenant checks only the headers of the
// point calls, which holds only while those are their only tenant fields.
// A tenant field added anywhere else in them fails this test (and must
// be checked there too, or the call left to the reflective walk).
func TestPointTenantFields(t *testing.T) {
	for _, c := range []struct {
		m    proto.Message
		want string
	}{
		{&api.GetRequest{}, "header.tenant"},
		{&api.PutRequest{}, "header.tenant"},
		{&api.DeleteRequest{}, "header.tenant"},
		{&api.CompareAndSwapRequest{}, "header.tenant"},
		{&api.MultiGetRequest{}, "gets.header.tenant"},
		{&api.CallRequest{}, "get.header.tenant multi_get.gets.header.tenant put.header.tenant delete.header.tenant compare_and_swap.header.tenant"},
	} {
		md := c.m.ProtoReflect().Descriptor()
		if got := strings.Join(tenantPaths(md, "", 0), " "); got != c.want {
			t.Errorf("%s holds tenants at %q; checkPointTenant checks %q", md.FullName(), got, c.want)
		}
	}
}

// TestPointTenantAsReflective: the fast path answers every point call as
// the reflective walk does: the same refusals, the same filled headers.
func TestPointTenantAsReflective(t *testing.T) {
	hdr := func(tenant string) *api.RequestHeader { return &api.RequestHeader{Tenant: tenant, Table: "t"} }
	var cases []proto.Message
	for _, h := range []*api.RequestHeader{nil, hdr(""), hdr("a"), hdr("b")} {
		cases = append(cases,
			&api.GetRequest{Header: h, Key: []byte("k")},
			&api.PutRequest{Header: h, Key: []byte("k")},
			&api.DeleteRequest{Header: h},
			&api.CompareAndSwapRequest{Header: h},
			&api.MultiGetRequest{Gets: []*api.GetRequest{{Header: hdr("a")}, {Header: h}, {Header: hdr("")}}},
			&api.CallRequest{Id: 1, Call: &api.CallRequest_Get{Get: &api.GetRequest{Header: h}}},
			&api.CallRequest{Id: 1, Call: &api.CallRequest_MultiGet{MultiGet: &api.MultiGetRequest{Gets: []*api.GetRequest{{Header: h}}}}},
			&api.CallRequest{Id: 1, Call: &api.CallRequest_Put{Put: &api.PutRequest{Header: h}}},
			&api.CallRequest{Id: 1, Call: &api.CallRequest_Delete{Delete: &api.DeleteRequest{Header: h}}},
			&api.CallRequest{Id: 1, Call: &api.CallRequest_CompareAndSwap{CompareAndSwap: &api.CompareAndSwapRequest{Header: h}}},
		)
	}
	for _, m := range cases {
		fast, slow := proto.Clone(m), proto.Clone(m)
		handled, ferr := checkPointTenant("a", fast)
		if !handled {
			t.Fatalf("%v: not handled by the fast path", m)
		}
		serr := checkTenant("a", slow.ProtoReflect(), 0)
		if (ferr == nil) != (serr == nil) || api.DetailOf(ferr).GetReason() != api.DetailOf(serr).GetReason() {
			t.Fatalf("%v: fast %v, reflective %v", m, ferr, serr)
		}
		if ferr == nil && !proto.Equal(fast, slow) {
			t.Fatalf("%v: fast left %v, reflective %v", m, fast, slow)
		}
	}
	if handled, _ := checkPointTenant("a", &api.CallRequest{Id: 1}); handled {
		t.Fatal("an empty call was handled by the fast path; the reflective walk must see it")
	}
	if handled, _ := checkPointTenant("a", &api.ScanRequest{}); handled {
		t.Fatal("a scan was handled by the fast path")
	}
}
