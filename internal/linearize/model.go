package linearize

import (
	"fmt"
	"sort"

	"github.com/anishathalye/porcupine"
)

// Kind is an operation of the key-value API.
type Kind uint8

const (
	// Get reads a key: Output.Found and Output.Value.
	Get Kind = iota + 1
	// Put sets Key to Value.
	Put
	// Delete removes Key: Output.Existed.
	Delete
	// CAS swaps Key's state if it matches the expectation: Output.Swapped,
	// Output.Existed and Output.Current.
	CAS
)

func (k Kind) String() string {
	switch k {
	case Get:
		return "get"
	case Put:
		return "put"
	case Delete:
		return "delete"
	case CAS:
		return "cas"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Input is an operation as the client sent it.
type Input struct {
	Kind Kind
	Key  string
	// Value is the value a Put writes, or a CAS writes on a match (unless
	// SwapDelete).
	Value string
	// ExpectAbsent makes a CAS match only an absent key; otherwise it
	// matches a present key whose value is exactly Expected.
	ExpectAbsent bool
	Expected     string
	// SwapDelete makes a CAS delete the key on a match.
	SwapDelete bool
}

// Output is what the reply said. Unknown marks an operation whose reply
// never came: the Recorder sets it, and the model then accepts any effect
// the operation could have had.
type Output struct {
	// Found and Value: a Get's result.
	Found bool
	Value string
	// Existed: whether a Delete or CAS found the key present.
	Existed bool
	// Swapped and Current: a CAS's result. Current is the value found when
	// not swapped (checked only then).
	Swapped bool
	Current string
	Unknown bool
}

// register is the state of one key. Comparable, so porcupine's default
// equality works.
type register struct {
	present bool
	value   string
}

func (r register) String() string {
	if !r.present {
		return "absent"
	}
	return fmt.Sprintf("%q", r.value)
}

// matches reports whether a CAS's expectation holds on r.
func (in Input) matches(r register) bool {
	if in.ExpectAbsent {
		return !r.present
	}
	return r.present && r.value == in.Expected
}

// after is the register once the write in takes effect on r.
func (in Input) after(r register) register {
	switch in.Kind {
	case Put:
		return register{present: true, value: in.Value}
	case Delete:
		return register{}
	case CAS:
		if !in.matches(r) {
			return r
		}
		if in.SwapDelete {
			return register{}
		}
		return register{present: true, value: in.Value}
	}
	return r
}

// step is the sequential specification of one key.
func step(state, input, output any) (bool, any) {
	r := state.(register)
	in := input.(Input)
	out := output.(Output)
	if out.Unknown {
		// Any effect the write could have had: a Get never gets here
		// (the Recorder drops unanswered reads).
		return true, in.after(r)
	}
	switch in.Kind {
	case Get:
		ok := out.Found == r.present && (!r.present || out.Value == r.value)
		return ok, r
	case Put:
		return true, in.after(r)
	case Delete:
		return out.Existed == r.present, in.after(r)
	case CAS:
		if out.Swapped != in.matches(r) || out.Existed != r.present {
			return false, r
		}
		if !out.Swapped && r.present && out.Current != r.value {
			return false, r
		}
		return true, in.after(r)
	}
	return false, r
}

// partitionByKey splits a history into one history per key, in key order
// (a stable order makes a failure's report repeatable).
func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := make(map[string][]porcupine.Operation)
	for _, op := range history {
		k := op.Input.(Input).Key
		byKey[k] = append(byKey[k], op)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}

// describeOperation renders one operation for porcupine's visualisation.
func describeOperation(input, output any) string {
	in := input.(Input)
	out := output.(Output)
	var call string
	switch in.Kind {
	case Get:
		call = fmt.Sprintf("get(%q)", in.Key)
	case Put:
		call = fmt.Sprintf("put(%q, %q)", in.Key, in.Value)
	case Delete:
		call = fmt.Sprintf("delete(%q)", in.Key)
	case CAS:
		exp := "absent"
		if !in.ExpectAbsent {
			exp = fmt.Sprintf("%q", in.Expected)
		}
		nv := "delete"
		if !in.SwapDelete {
			nv = fmt.Sprintf("%q", in.Value)
		}
		call = fmt.Sprintf("cas(%q, %s -> %s)", in.Key, exp, nv)
	default:
		call = in.Kind.String()
	}
	if out.Unknown {
		return call + " -> ?"
	}
	switch in.Kind {
	case Get:
		if !out.Found {
			return call + " -> not found"
		}
		return fmt.Sprintf("%s -> %q", call, out.Value)
	case Put:
		return call + " -> ok"
	case Delete:
		return fmt.Sprintf("%s -> existed=%v", call, out.Existed)
	case CAS:
		if out.Swapped {
			return fmt.Sprintf("%s -> swapped (existed=%v)", call, out.Existed)
		}
		if !out.Existed {
			return call + " -> not swapped, absent"
		}
		return fmt.Sprintf("%s -> not swapped, current %q", call, out.Current)
	}
	return call
}

// Model returns the porcupine model of a map of registers, partitioned by
// key: its state per partition is one key's register, absent at first.
// Histories hold Input and Output values.
func Model() porcupine.Model {
	return porcupine.Model{
		Partition:         partitionByKey,
		Init:              func() any { return register{} },
		Step:              step,
		DescribeOperation: describeOperation,
		DescribeState:     func(state any) string { return state.(register).String() },
	}
}
