package tableserver

import (
	"bytes"
	"fmt"

	"github.com/tabuladb/tabula/api"
)

// Conditional batches: a BatchWrite whose mutations carry conditions
// (api.Condition) applies only if every condition holds against the
// partition's state before the batch, all or nothing: the compare-and-set
// of an entity group transaction (an insert must find its key absent, an
// update its key present with the ETag it names). The conditions are
// checked in the same step that decides the write, under the log replica's
// lock (writes in flight included) or, for partitions without a log, under
// the partition's exclusive write lock, so no write can slip in between.

// batchCond is one mutation's condition.
type batchCond struct {
	index  int // the mutation's index in the request
	kind   api.Condition_Kind
	prefix []byte
}

// maxShownPrefix bounds the bytes of a value a failed prefix condition
// quotes back.
const maxShownPrefix = 32

// parseConditions checks the conditions of muts and returns those to
// evaluate (nil when the batch has none). A conditional batch may not name
// a key twice: its conditions are checked against the state before the
// batch, which a second mutation of the key would make ambiguous. (An
// unconditional batch may: a later mutation of a key wins, as before.)
func parseConditions(muts []*api.Mutation, maxPrefix uint64) ([]batchCond, error) {
	var conds []batchCond
	for i, m := range muts {
		c := m.GetCondition()
		field := "mutations[" + itoa(i) + "].condition"
		switch c.GetKind() {
		case api.Condition_KIND_NONE:
			if len(c.GetPrefix()) > 0 {
				return nil, api.InvalidArgument(field+".prefix", "condition_invalid", 0, "%s has a prefix but kind KIND_NONE; the prefix applies to KIND_PREFIX", field)
			}
			continue
		case api.Condition_KIND_ABSENT, api.Condition_KIND_PRESENT:
			if len(c.GetPrefix()) > 0 {
				return nil, api.InvalidArgument(field+".prefix", "condition_invalid", 0, "%s has a prefix but kind %v; the prefix applies to KIND_PREFIX", field, c.GetKind())
			}
		case api.Condition_KIND_PREFIX:
			if uint64(len(c.GetPrefix())) > maxPrefix {
				return nil, api.InvalidArgument(field+".prefix", "prefix_too_large", maxPrefix, "%s has a prefix of %d bytes; the limit is the value limit, %d", field, len(c.GetPrefix()), maxPrefix)
			}
		default:
			return nil, api.InvalidArgument(field+".kind", "condition_invalid", 0, "%s has kind %v; want KIND_NONE, KIND_ABSENT, KIND_PRESENT or KIND_PREFIX", field, c.GetKind())
		}
		conds = append(conds, batchCond{index: i, kind: c.GetKind(), prefix: c.GetPrefix()})
	}
	if len(conds) == 0 {
		return nil, nil
	}
	seen := make(map[string]int, len(muts))
	for i, m := range muts {
		if j, dup := seen[string(m.GetKey())]; dup {
			return nil, api.InvalidArgument("mutations["+itoa(i)+"].key", "duplicate_key", 0,
				"mutations[%d] and mutations[%d] both name key %q; a batch with conditions names each key once", j, i, m.GetKey())
		}
		seen[string(m.GetKey())] = i
	}
	return conds, nil
}

// checkConditions evaluates conds in order against the state get reads
// (an expired record reads as absent) and returns the FAILED_PRECONDITION
// error of the first that does not hold, nil if all hold. get's errors are
// returned as they are.
func checkConditions(conds []batchCond, muts []*api.Mutation, get func(key []byte) ([]byte, bool, error)) error {
	for _, c := range conds {
		key := muts[c.index].GetKey()
		v, found, err := get(key)
		if err != nil {
			return err
		}
		var why string
		switch c.kind {
		case api.Condition_KIND_ABSENT:
			if found {
				why = "must be absent but is present"
			}
		case api.Condition_KIND_PRESENT:
			if !found {
				why = "must be present but is absent"
			}
		case api.Condition_KIND_PREFIX:
			switch {
			case !found:
				why = fmt.Sprintf("must be present with a value starting %x but is absent", shown(c.prefix))
			case !bytes.HasPrefix(v, c.prefix):
				why = fmt.Sprintf("must have a value starting %x but its value starts %x", shown(c.prefix), shown(v[:min(len(v), len(c.prefix))]))
			}
		}
		if why != "" {
			field := "mutations[" + itoa(c.index) + "]"
			return api.Status(&api.ErrorDetail{Code: api.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, Reason: "condition_failed", Field: field},
				fmt.Sprintf("%s: condition %v failed: key %q %s; nothing in the batch was applied", field, c.kind, key, why))
		}
	}
	return nil
}

// shown is b cut to what an error message quotes.
func shown(b []byte) []byte { return b[:min(len(b), maxShownPrefix)] }
