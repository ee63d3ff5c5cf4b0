package queue

// The queue service keeps all of an account's queues in one ordered
// table of the account's tenant, StoreTable. Keys (never change or
// reuse the tags):
//
//	'q' 0x00 <queue>                         a queue (queueRecord)
//	'm' 0x00 <queue> 0x00 <gen (8)> <id (16)> a message (messageRecord)
//	's' 0x00 "service"                       service properties (raw XML)
//
// <gen> is the queue's generation, drawn at random when it is created:
// messages of a deleted queue that a racing Put wrote after the delete's
// sweep belong to an old generation and are never seen by a queue of
// the same name created later. <id> is the message id: its insertion
// time (Unix nanoseconds, big-endian) then 8 random bytes, so a queue's
// messages lie in insertion order and Get Messages finds the oldest
// visible ones first.
//
// A message keeps its key for its whole life: a dequeue or an update
// rewrites its value in place with a compare-and-swap on the value it
// read, so the change is atomic on any partition layout (moving the
// record to a key ordered by visibility would need a two-key atomic
// write, which the cluster gives only within one partition).
//
// Values are framed (never change or reuse the version byte):
//
//	| version (1) = 1 | crc32c (4, little-endian) of payload | payload |
//
// A queue's payload is JSON (queueRecord). A message's payload:
//
//	| inserted (8) | expires (8) | visible (8) | dequeues (4) | len(receipt) (1) | receipt | text |
//
// times in Unix milliseconds, big-endian; expires = math.MaxInt64 for a
// message that never expires.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"time"
)

// StoreTable is the ordered table of a tenant holding its queues and
// messages. Reserved: do not create, write or drop it by hand. Its name
// is no legal Azure table or queue name.
const StoreTable = "azure-queue-store"

const recordV1 = 1

// ErrCorrupt marks a stored queue or message that fails its checksum or
// does not decode.
var ErrCorrupt = errors.New("queue: stored record is corrupt")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func frame(payload []byte) []byte {
	out := make([]byte, 5, 5+len(payload))
	out[0] = recordV1
	binary.LittleEndian.PutUint32(out[1:5], crc32.Checksum(payload, castagnoli))
	return append(out, payload...)
}

func unframe(b []byte) ([]byte, error) {
	if len(b) < 5 {
		return nil, fmt.Errorf("%w: %d bytes", ErrCorrupt, len(b))
	}
	if b[0] != recordV1 {
		return nil, fmt.Errorf("%w: unknown format version %d (a newer gateway wrote it?)", ErrCorrupt, b[0])
	}
	if got, want := crc32.Checksum(b[5:], castagnoli), binary.LittleEndian.Uint32(b[1:5]); got != want {
		return nil, fmt.Errorf("%w: checksum %08x, want %08x", ErrCorrupt, got, want)
	}
	return b[5:], nil
}

// metaPair is one metadata item, its name as the client spelled it.
type metaPair struct {
	Name  string `json:"n"`
	Value string `json:"v"`
}

// accessPolicy is one stored access policy (signed identifier).
type accessPolicy struct {
	ID         string `json:"id"`
	Start      string `json:"st,omitempty"`
	Expiry     string `json:"se,omitempty"`
	Permission string `json:"sp,omitempty"`
}

// queueRecord is a queue.
type queueRecord struct {
	Gen      uint64         `json:"gen"`
	Metadata []metaPair     `json:"meta,omitempty"`
	ACL      []accessPolicy `json:"acl,omitempty"`
}

func encodeQueue(q *queueRecord) []byte {
	b, err := json.Marshal(q)
	if err != nil {
		panic("queue: a queue record does not marshal: " + err.Error())
	}
	return frame(b)
}

func decodeQueue(b []byte) (*queueRecord, error) {
	p, err := unframe(b)
	if err != nil {
		return nil, err
	}
	q := &queueRecord{}
	if err := json.Unmarshal(p, q); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return q, nil
}

// maxRecordTTL is the longest record TTL the cluster takes (100 years),
// in ms.
const maxRecordTTL = 100 * 365 * 24 * 3600 * 1000

// never is the expiry of a message that does not expire.
const never = math.MaxInt64

// messageRecord is a message.
type messageRecord struct {
	Inserted, Expires, Visible int64 // Unix ms; Expires == never: no expiry
	Dequeues                   uint32
	Receipt                    string // the pop receipt of the last Put, Get or Update
	Text                       string
}

const messageHeader = 8 + 8 + 8 + 4 + 1

func encodeMessage(m *messageRecord) []byte {
	if len(m.Receipt) > 255 {
		panic("queue: pop receipt longer than 255 bytes")
	}
	p := make([]byte, messageHeader, messageHeader+len(m.Receipt)+len(m.Text))
	binary.BigEndian.PutUint64(p[0:], uint64(m.Inserted))
	binary.BigEndian.PutUint64(p[8:], uint64(m.Expires))
	binary.BigEndian.PutUint64(p[16:], uint64(m.Visible))
	binary.BigEndian.PutUint32(p[24:], m.Dequeues)
	p[28] = byte(len(m.Receipt))
	p = append(p, m.Receipt...)
	p = append(p, m.Text...)
	return frame(p)
}

func decodeMessage(b []byte) (*messageRecord, error) {
	p, err := unframe(b)
	if err != nil {
		return nil, err
	}
	if len(p) < messageHeader || len(p) < messageHeader+int(p[28]) {
		return nil, fmt.Errorf("%w: a message of %d bytes", ErrCorrupt, len(p))
	}
	n := int(p[28])
	return &messageRecord{
		Inserted: int64(binary.BigEndian.Uint64(p[0:])),
		Expires:  int64(binary.BigEndian.Uint64(p[8:])),
		Visible:  int64(binary.BigEndian.Uint64(p[16:])),
		Dequeues: binary.BigEndian.Uint32(p[24:]),
		Receipt:  string(p[messageHeader : messageHeader+n]),
		Text:     string(p[messageHeader+n:]),
	}, nil
}

// expired says whether m has expired at now (Unix ms).
func (m *messageRecord) expired(now int64) bool { return m.Expires != never && m.Expires <= now }

// ttl is what is left of m's life at now, for the record's own expiry
// in the table (0: none).
func (m *messageRecord) ttl(now int64) time.Duration {
	if m.Expires == never {
		return 0
	}
	left := m.Expires - now
	if left > maxRecordTTL {
		return 0 // past what the table keeps a TTL for: checked on read only
	}
	// A millisecond at least: a zero TTL would mean "the table's default".
	return time.Duration(max(left, 1)) * time.Millisecond
}

// Keys.

func queueKey(name string) []byte { return append([]byte("q\x00"), name...) }

var queuesPrefix = []byte("q\x00")

var serviceKey = []byte("s\x00service")

// messagesPrefix is the prefix of the keys of queue name's messages of
// generation gen.
func messagesPrefix(name string, gen uint64) []byte {
	k := make([]byte, 0, 3+len(name)+8+16)
	k = append(k, 'm', 0)
	k = append(k, name...)
	k = append(k, 0)
	return binary.BigEndian.AppendUint64(k, gen)
}

func messageKey(name string, gen uint64, id [16]byte) []byte {
	return append(messagesPrefix(name, gen), id[:]...)
}

// prefixEnd is the first key after every key starting with p (nil: none).
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}
