package auth

import (
	"sync"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tabuladb/tabula/api"
)

// maxTenantDepth bounds the walk of nested messages.
const maxTenantDepth = 4

// holdsTenant caches, per message type, whether a "tenant" string field
// can occur in it or in the messages it holds.
var holdsTenant sync.Map // protoreflect.FullName → bool

func mayHoldTenant(md protoreflect.MessageDescriptor, depth int) bool {
	if v, ok := holdsTenant.Load(md.FullName()); ok {
		return v.(bool)
	}
	found := false
	if depth <= maxTenantDepth {
		fs := md.Fields()
		for i := 0; i < fs.Len() && !found; i++ {
			f := fs.Get(i)
			switch {
			case f.Name() == "tenant" && f.Kind() == protoreflect.StringKind && !f.IsList() && !f.IsMap():
				found = true
			case f.Kind() == protoreflect.MessageKind && !f.IsMap() && f.Message().FullName() != md.FullName():
				found = mayHoldTenant(f.Message(), depth+1)
			}
		}
	}
	holdsTenant.Store(md.FullName(), found)
	return found
}

func checkTenant(tenant string, m protoreflect.Message, depth int) error {
	if depth > maxTenantDepth || !mayHoldTenant(m.Descriptor(), depth) {
		return nil
	}
	fs := m.Descriptor().Fields()
	for i := 0; i < fs.Len(); i++ {
		f := fs.Get(i)
		switch {
		case f.Name() == "tenant" && f.Kind() == protoreflect.StringKind && !f.IsList() && !f.IsMap():
			switch got := m.Get(f).String(); got {
			case tenant:
			case "":
				m.Set(f, protoreflect.ValueOfString(tenant))
			default:
				return denied("other_tenant", "tenant %q may not act on tenant %q", tenant, got)
			}
		case f.Kind() == protoreflect.MessageKind && f.IsList():
			l := m.Get(f).List()
			for j := 0; j < l.Len(); j++ {
				if err := checkTenant(tenant, l.Get(j).Message(), depth+1); err != nil {
					return err
				}
			}
		case f.Kind() == protoreflect.MessageKind && !f.IsMap():
			if !m.Has(f) {
				continue // an absent header names no tenant; the handler refuses it
			}
			if err := checkTenant(tenant, m.Get(f).Message(), depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkPointTenant is checkTenant for the point calls (Get, MultiGet,
// Put, Delete, CompareAndSwap, alone or on the Calls stream), most of a
// busy server's requests, without reflection: their only tenant fields
// are their headers' (TestPointTenantFields keeps it so). handled is
// false for every other message.
func checkPointTenant(tenant string, req any) (handled bool, err error) {
	if c, ok := req.(*api.CallRequest); ok {
		switch x := c.GetCall().(type) {
		case *api.CallRequest_Get:
			req = x.Get
		case *api.CallRequest_MultiGet:
			req = x.MultiGet
		case *api.CallRequest_Put:
			req = x.Put
		case *api.CallRequest_Delete:
			req = x.Delete
		case *api.CallRequest_CompareAndSwap:
			req = x.CompareAndSwap
		default:
			return false, nil
		}
	}
	switch r := req.(type) {
	case *api.GetRequest:
		return true, checkHeaderTenant(tenant, r.GetHeader())
	case *api.PutRequest:
		return true, checkHeaderTenant(tenant, r.GetHeader())
	case *api.DeleteRequest:
		return true, checkHeaderTenant(tenant, r.GetHeader())
	case *api.CompareAndSwapRequest:
		return true, checkHeaderTenant(tenant, r.GetHeader())
	case *api.MultiGetRequest:
		for _, g := range r.GetGets() {
			if err := checkHeaderTenant(tenant, g.GetHeader()); err != nil {
				return true, err
			}
		}
		return true, nil
	}
	return false, nil
}

// checkHeaderTenant is checkTenant's rule for one header: its tenant must
// be the principal's, and an empty one becomes it. An absent header names
// no tenant; the handler refuses it.
func checkHeaderTenant(tenant string, h *api.RequestHeader) error {
	if h == nil {
		return nil
	}
	switch h.GetTenant() {
	case tenant:
	case "":
		h.Tenant = tenant
	default:
		return denied("other_tenant", "tenant %q may not act on tenant %q", tenant, h.GetTenant())
	}
	return nil
}
