package tablemaster

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

var updateSeeds = flag.Bool("update-seeds", false, "rewrite the fuzz seed corpus in testdata/fuzz")

// seedLog returns a valid command log of n workload commands.
func seedLog(n int) []byte {
	b := encodeFileHeader(logMagic)
	for i, c := range workload(n) {
		p, _ := json.Marshal(logEntry{Seq: uint64(i + 1), Cmd: c})
		b = appendRecord(b, p)
	}
	return b
}

// seedSnapshot returns a valid snapshot of n workload commands.
func seedSnapshot(n int) []byte {
	st := NewState()
	for _, c := range workload(n) {
		if _, err := st.Apply(c); err != nil {
			panic(err)
		}
	}
	p, _ := json.Marshal(snapshotBody{Seq: uint64(n), State: st})
	return appendRecord(encodeFileHeader(snapMagic), p)
}

func seeds() [][]byte {
	log := seedLog(8)
	return [][]byte{
		nil,
		encodeFileHeader(logMagic),
		log,
		log[:len(log)-7],                         // torn tail
		append(log[:len(log):len(log)], 0, 0, 0), // zero tail
		seedSnapshot(8),
	}
}

func addSeeds(f *testing.F) {
	for _, s := range seeds() {
		f.Add(s)
	}
}

// TestWriteFuzzSeeds rewrites testdata/fuzz with -update-seeds.
func TestWriteFuzzSeeds(t *testing.T) {
	if !*updateSeeds {
		t.Skip("run with -update-seeds to rewrite testdata/fuzz")
	}
	for _, target := range []string{"FuzzDecodeRecords", "FuzzReplayLog", "FuzzDecodeSnapshot"} {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seeds() {
			data := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%d", i)), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// FuzzDecodeRecords: the record decoder never panics, and what it accepts
// re-encodes to exactly the intact prefix it reported.
func FuzzDecodeRecords(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		body := data
		if len(body) >= fileHeaderLen {
			body = body[fileHeaderLen:]
		}
		payloads, valid, torn, err := decodeRecords(body)
		if err != nil {
			return
		}
		if valid > len(body) || (!torn && valid != len(body)) {
			t.Fatalf("valid %d of %d bytes, torn %v", valid, len(body), torn)
		}
		var re []byte
		for _, p := range payloads {
			re = appendRecord(re, p)
		}
		if !bytes.Equal(re, body[:valid]) {
			t.Fatalf("re-encoded records differ from the intact prefix")
		}
	})
}

// FuzzReplayLog: replaying any bytes as a command log never panics, and
// either fails or yields a state that replays identically.
func FuzzReplayLog(f *testing.F) {
	addSeeds(f)
	logger := slog.New(slog.DiscardHandler)
	f.Fuzz(func(t *testing.T, data []byte) {
		st := NewState()
		_, valid, seq, err := replayLog(data, st, 0, logger)
		if err != nil {
			return
		}
		again := NewState()
		_, _, seq2, err := replayLog(data[:valid], again, 0, logger)
		if err != nil || seq2 != seq {
			t.Fatalf("replaying the intact prefix: seq %d vs %d, err %v", seq2, seq, err)
		}
	})
}

// FuzzDecodeSnapshot: decoding any bytes as a snapshot never panics.
func FuzzDecodeSnapshot(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		st, _, err := decodeSnapshot(data)
		if err == nil && st == nil {
			t.Fatalf("nil state without error")
		}
	})
}
