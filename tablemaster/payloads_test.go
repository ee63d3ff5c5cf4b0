package tablemaster

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// allPayloads is one payload of every op, each field set (fillValue).
func allPayloads(t testing.TB) []Payload {
	ps := []Payload{
		CreateTenant{}, DeleteTenant{}, RotateTenantKey{}, SetTenantQuota{}, CreateTable{}, DropTable{},
		RegisterServer{}, ServerDown{}, ForgetServer{}, ClearDataLoss{}, PlaceShort{},
		BulkPublish{}, BulkLoaded{}, BulkRollback{}, BulkStored{}, BulkRolloutAction{}, BulkAdvance{},
		StreamCommand{}, CoprocDeploy{}, CoprocReady{}, CoprocRollback{},
		PartitionLogAllocated{}, PartitionLogReset{}, MoveReplica{}, MoveDone{}, ReplicaFailed{}, HandoffDone{},
		TransferPrimary{}, SplitPartition{}, SplitDone{}, AlterTable{}, MergePartitions{}, MergeDone{},
	}
	seen := map[Op]bool{}
	for i, p := range ps {
		v := reflect.New(reflect.TypeOf(p)).Elem()
		fillValue(v, 0)
		ps[i] = v.Interface().(Payload)
		if seen[p.Op()] {
			t.Fatalf("two payloads of op %s", p.Op())
		}
		seen[p.Op()] = true
	}
	return ps
}

// opsAfterFixture are the ops of allPayloads newer than the replay
// fixture's log, which TestPayloadsLegacyLog cannot find there.
var opsAfterFixture = []Op{OpTransferPrimary, OpSplitPartition, OpSplitDone, OpAlterTable, OpMergePartitions, OpMergeDone}

// fillValue sets every field of v to a value that is not zero.
func fillValue(v reflect.Value, depth int) {
	switch v.Kind() {
	case reflect.String:
		v.SetString("x" + v.Type().Name())
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint32, reflect.Uint64:
		v.SetUint(9)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fillValue(s.Index(0), depth+1)
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fillValue(k, depth+1)
		fillValue(e, depth+1)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fillValue(p.Elem(), depth+1)
		v.Set(p)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() && depth < 3 {
				fillValue(v.Field(i), depth+1)
			}
		}
	}
}

// TestPayloadsEncodeFlat: a command made with a typed payload encodes
// byte for byte as the same command made with today's flat fields, and
// decodes back to the same payload.
func TestPayloadsEncodeFlat(t *testing.T) {
	for _, p := range allPayloads(t) {
		typed := Command{UnixMs: 42, RequestID: "r-1", Payload: p}
		got, err := json.Marshal(typed)
		if err != nil {
			t.Fatalf("%s: %v", p.Op(), err)
		}
		flat := flatCommand{Op: p.Op(), UnixMs: 42, RequestID: "r-1"}
		flat.setPayload(p)
		want, err := json.Marshal(flat)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: typed encodes\n%s\nflat encodes\n%s", p.Op(), got, want)
		}
		var back Command
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("%s: decode: %v", p.Op(), err)
		}
		if back.Op() != p.Op() || back.UnixMs != 42 || back.RequestID != "r-1" || !reflect.DeepEqual(back.payload(), p) {
			t.Fatalf("%s: round trip gives %#v, want %#v", p.Op(), back.payload(), p)
		}
	}
}

// TestPayloadsLegacyLog decodes every command of the replay fixture (a
// log written before typed payloads) and re-encodes it from its payload
// alone: the bytes are the ones logged.
func TestPayloadsLegacyLog(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(replayDir, logFileName))
	if err != nil {
		t.Fatal(err)
	}
	body, err := checkFileHeader(data, logMagic)
	if err != nil {
		t.Fatal(err)
	}
	payloads, _, _, err := decodeRecords(body)
	if err != nil {
		t.Fatal(err)
	}
	ops := map[Op]bool{}
	for i, rec := range payloads {
		var e logEntry
		if err := json.Unmarshal(rec, &e); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		p := e.Cmd.payload()
		if p == nil {
			t.Fatalf("record %d: op %q has no payload", i, e.Cmd.Op())
		}
		ops[p.Op()] = true
		typed := logEntry{Seq: e.Seq, Cmd: Command{UnixMs: e.Cmd.UnixMs, RequestID: e.Cmd.RequestID, Payload: p}}
		got, err := json.Marshal(typed)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, rec) {
			t.Fatalf("record %d re-encodes as\n%s\nlogged\n%s", i, got, rec)
		}
	}
	if len(ops) != len(allPayloads(t))-len(opsAfterFixture) {
		t.Fatalf("the fixture log holds %d ops of %d", len(ops), len(allPayloads(t))-len(opsAfterFixture))
	}
}

// FuzzCommandJSON decodes arbitrary bytes as a logged command: it never
// panics, and a command that decodes re-encodes from its typed payload
// to bytes that re-encode the same.
func FuzzCommandJSON(f *testing.F) {
	for _, p := range allPayloads(f) {
		b, _ := json.Marshal(Command{UnixMs: 1, Payload: p})
		f.Add(b)
	}
	f.Add([]byte(`{"op":"nope","tenant":"x"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var c Command
		if err := json.Unmarshal(data, &c); err != nil {
			return
		}
		p := c.payload()
		if p == nil {
			return // an unknown op: apply refuses it
		}
		b, err := json.Marshal(Command{UnixMs: c.UnixMs, RequestID: c.RequestID, Payload: p})
		if err != nil {
			t.Fatal(err)
		}
		var back Command
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("re-encoded command does not decode: %v\n%s", err, b)
		}
		// Bytes, not values: JSON's omitempty turns an empty list into
		// none, which is the same command.
		again, err := json.Marshal(Command{UnixMs: back.UnixMs, RequestID: back.RequestID, Payload: back.payload()})
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("payload %#v encodes as\n%s\nthen as\n%s (%v)", p, b, again, err)
		}
	})
}
