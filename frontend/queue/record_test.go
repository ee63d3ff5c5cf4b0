package queue

import (
	"errors"
	"testing"
)

func TestMessageRecordRoundTrip(t *testing.T) {
	for _, m := range []messageRecord{
		{Inserted: 1, Expires: never, Visible: 2, Dequeues: 3, Receipt: "abc", Text: "hello <&>"},
		{Inserted: 1 << 40, Expires: 1<<40 + 1000, Visible: 0, Receipt: "", Text: ""},
	} {
		got, err := decodeMessage(encodeMessage(&m))
		if err != nil || *got != m {
			t.Fatalf("round trip of %+v: %+v, %v", m, got, err)
		}
	}
}

func TestRecordsRefuseCorruption(t *testing.T) {
	b := encodeMessage(&messageRecord{Inserted: 5, Expires: never, Receipt: "r", Text: "payload"})
	for i := range b {
		c := append([]byte(nil), b...)
		c[i] ^= 0x10
		if _, err := decodeMessage(c); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flipped byte %d: err %v, want ErrCorrupt", i, err)
		}
	}
	q := encodeQueue(&queueRecord{Gen: 7, Metadata: []metaPair{{"a", "b"}}})
	for i := range q {
		c := append([]byte(nil), q...)
		c[i] ^= 0x01
		if _, err := decodeQueue(c); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flipped queue byte %d: err %v, want ErrCorrupt", i, err)
		}
	}
	if _, err := decodeMessage(b[:4]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("truncated: %v", err)
	}
}

func TestMessageIDs(t *testing.T) {
	s := &store{}
	var ids [][16]byte
	for range 3 {
		ids = append(ids, s.newMessageID(timeZero))
	}
	for i, id := range ids {
		back, ok := parseID(formatID(id))
		if !ok || back != id {
			t.Fatalf("id %x: parsed back %x, %v", id, back, ok)
		}
		if i > 0 && string(ids[i-1][:8]) >= string(id[:8]) {
			t.Fatalf("ids of one clock tick do not increase: %x then %x", ids[i-1], id)
		}
	}
	for _, bad := range []string{"", "not-an-id", "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"} {
		if _, ok := parseID(bad); ok {
			t.Fatalf("parseID(%q) accepted", bad)
		}
	}
}

func TestValidQueueName(t *testing.T) {
	for name, ok := range map[string]bool{"abc": true, "a-b-c": true, "0abc": true, "ab": false, "Abc": false, "a--b": false,
		"-ab": false, "ab-": false, "a_b": false, string(make([]byte, 64)): false} {
		if got := validQueueName(name) == nil; got != ok {
			t.Errorf("validQueueName(%q) = %v, want %v", name, got, ok)
		}
	}
}
