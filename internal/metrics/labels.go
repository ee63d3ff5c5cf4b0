package metrics

import (
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tabuladb/tabula/api"
)

// pair is a (tenant, table) label pair.
type pair struct{ tenant, table string }

// labeler admits at most max distinct pairs for the life of the process,
// first come first served; the rest map to (Other, Other). Safe for
// concurrent use.
type labeler struct {
	max int

	mu sync.RWMutex
	// Guarded by mu.
	seen map[pair]struct{}
}

func newLabeler(max int) *labeler {
	return &labeler{max: max, seen: make(map[pair]struct{})}
}

// label returns the labels for (tenant, table) and whether the pair was
// over the cap. Names that are not valid names become Invalid first.
func (l *labeler) label(tenant, table string) (string, string, bool) {
	p := pair{cleanName(tenant), cleanName(table)}
	l.mu.RLock()
	_, ok := l.seen[p]
	l.mu.RUnlock()
	if ok {
		return p.tenant, p.table, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[p]; ok {
		return p.tenant, p.table, false
	}
	if len(l.seen) >= l.max {
		return Other, Other, true
	}
	l.seen[p] = struct{}{}
	return p.tenant, p.table, false
}

// size is how many pairs have their own labels.
func (l *labeler) size() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return len(l.seen)
}

// cleanName keeps an empty or valid name and replaces anything else by
// Invalid.
func cleanName(s string) string {
	if s == "" || validName(s) {
		return s
	}
	return Invalid
}

// validName is api.ValidateName without building an error: 1 to
// api.MaxNameLen letters, digits, '-' and '_', starting with a letter.
func validName(s string) bool {
	if len(s) == 0 || len(s) > api.MaxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// tenantTable reads the tenant and table a request names: string fields
// "tenant" and "table" at its top level or in its "header" message; with a
// tenant and no "table" field, "name" is the table (CreateTable and the
// like). Anything else gives empty strings.
func tenantTable(m any) (tenant, table string) {
	pm, ok := m.(proto.Message)
	if !ok {
		return "", ""
	}
	r := pm.ProtoReflect()
	if !r.IsValid() {
		return "", ""
	}
	fields := r.Descriptor().Fields()
	if f := fields.ByName("tenant"); isString(f) {
		tenant = r.Get(f).String()
		if f := fields.ByName("table"); isString(f) {
			table = r.Get(f).String()
		} else if f := fields.ByName("name"); isString(f) {
			table = r.Get(f).String()
		}
		return tenant, table
	}
	if f := fields.ByName("header"); f != nil && f.Kind() == protoreflect.MessageKind && !f.IsList() && !f.IsMap() && r.Has(f) {
		h := r.Get(f).Message()
		hf := h.Descriptor().Fields()
		if f := hf.ByName("tenant"); isString(f) {
			tenant = h.Get(f).String()
		}
		if f := hf.ByName("table"); isString(f) {
			table = h.Get(f).String()
		}
	}
	return tenant, table
}

func isString(f protoreflect.FieldDescriptor) bool {
	return f != nil && f.Kind() == protoreflect.StringKind && f.Cardinality() != protoreflect.Repeated
}

// opOf turns a gRPC full method ("/tabula.v1.TableServer/Put") into the op
// label ("TableServer/Put"): the service without its package, and the
// method.
func opOf(fullMethod string) string {
	s := strings.TrimPrefix(fullMethod, "/")
	slash := strings.IndexByte(s, '/')
	if slash < 0 {
		return s
	}
	if dot := strings.LastIndexByte(s[:slash], '.'); dot >= 0 {
		return s[dot+1:]
	}
	return s
}
