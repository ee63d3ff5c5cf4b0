package queue

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// store is one account's queues and messages in its StoreTable. It keeps
// no state beyond whether the table is known to exist: every operation
// reads and writes the table, so any number of servers share it. Safe
// for concurrent use.
type store struct {
	c     *client.Client
	now   func() time.Time
	ready atomic.Bool // StoreTable is known to exist
	// lastID is the time part of the last message id drawn: ids of one
	// server increase, so its messages keep their order even within one
	// tick of a coarse clock (across servers, order is by clock only, as
	// the service promises no strict order).
	lastID atomic.Int64
}

// scanChunk bounds one range read of a queue's messages.
const scanChunk = 256

// maxSwapAttempts bounds a read-modify-write's retries on contention.
const maxSwapAttempts = 100

func (s *store) tbl() *client.Table { return s.c.Table(StoreTable) }

func (s *store) nowMs() int64 { return s.now().UnixMilli() }

// tableMissing says err means StoreTable does not exist.
func tableMissing(err error) bool {
	return api.CodeOf(err) == api.ErrorCode_ERROR_CODE_NOT_FOUND && !errors.Is(err, client.ErrKeyNotFound)
}

// ensure creates StoreTable if it does not exist.
func (s *store) ensure(ctx context.Context) error {
	if s.ready.Load() {
		return nil
	}
	_, err := s.c.CreateTable(ctx, StoreTable, api.TableKind_TABLE_KIND_ORDERED, &api.TableOptions{})
	if err != nil && api.CodeOf(err) != api.ErrorCode_ERROR_CODE_ALREADY_EXISTS {
		return fmt.Errorf("create the queue store table: %w", err)
	}
	s.ready.Store(true)
	return nil
}

// get reads key: nil, nil when absent (or when the table does not exist).
func (s *store) get(ctx context.Context, key []byte) ([]byte, error) {
	b, err := s.tbl().Get(ctx, key)
	switch {
	case errors.Is(err, client.ErrKeyNotFound):
		return nil, nil
	case tableMissing(err):
		s.ready.Store(false)
		return nil, nil
	case err != nil:
		return nil, err
	}
	return b, nil
}

// queue reads queue name; nil when it does not exist.
func (s *store) queue(ctx context.Context, name string) (*queueRecord, []byte, error) {
	raw, err := s.get(ctx, queueKey(name))
	if err != nil || raw == nil {
		return nil, nil, err
	}
	q, err := decodeQueue(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("read queue %q: %w", name, err)
	}
	return q, raw, nil
}

// mustQueue is queue, with QueueNotFound when it does not exist.
func (s *store) mustQueue(ctx context.Context, name string) (*queueRecord, []byte, error) {
	q, raw, err := s.queue(ctx, name)
	if err == nil && q == nil {
		err = errQueueNotFound
	}
	return q, raw, err
}

func randomU64() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])
}

// sameMetadata compares metadata as the service does: names without
// regard to case, values exactly.
func sameMetadata(a, b []metaPair) bool {
	norm := func(m []metaPair) []string {
		out := make([]string, len(m))
		for i, p := range m {
			out[i] = strings.ToLower(p.Name) + "\x00" + p.Value
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(norm(a), norm(b))
}

// createQueue creates queue name. created is false when it existed with
// the same metadata (the service answers 204); another metadata is
// QueueAlreadyExists.
func (s *store) createQueue(ctx context.Context, name string, meta []metaPair) (created bool, err error) {
	if err := s.ensure(ctx); err != nil {
		return false, err
	}
	rec := &queueRecord{Gen: randomU64(), Metadata: meta}
	res, err := s.tbl().CompareAndSwap(ctx, client.CAS{Key: queueKey(name), ExpectAbsent: true, Value: encodeQueue(rec)})
	if tableMissing(err) {
		s.ready.Store(false)
		if err := s.ensure(ctx); err != nil {
			return false, err
		}
		res, err = s.tbl().CompareAndSwap(ctx, client.CAS{Key: queueKey(name), ExpectAbsent: true, Value: encodeQueue(rec)})
	}
	if err != nil {
		return false, fmt.Errorf("create queue %q: %w", name, err)
	}
	if res.Swapped {
		return true, nil
	}
	cur, err := decodeQueue(res.Current)
	if err != nil {
		return false, fmt.Errorf("create queue %q: %w", name, err)
	}
	if !sameMetadata(cur.Metadata, meta) {
		return false, errQueueExists
	}
	return false, nil
}

// updateQueue rewrites queue name with fn's change, as a compare-and-swap
// retried on contention. Durable when it returns nil.
func (s *store) updateQueue(ctx context.Context, name string, fn func(q *queueRecord)) error {
	for range maxSwapAttempts {
		q, raw, err := s.mustQueue(ctx, name)
		if err != nil {
			return err
		}
		fn(q)
		res, err := s.tbl().CompareAndSwap(ctx, client.CAS{Key: queueKey(name), Expected: raw, Value: encodeQueue(q)})
		if err != nil {
			return fmt.Errorf("update queue %q: %w", name, err)
		}
		if res.Swapped {
			return nil
		}
	}
	return fmt.Errorf("update queue %q: still contended after %d attempts", name, maxSwapAttempts)
}

// deleteQueue deletes queue name, then its messages. Messages a racing
// Put writes after the sweep belong to a dead generation: no queue ever
// reads them again.
func (s *store) deleteQueue(ctx context.Context, name string) error {
	q, raw, err := s.mustQueue(ctx, name)
	if err != nil {
		return err
	}
	res, err := s.tbl().CompareAndSwap(ctx, client.CAS{Key: queueKey(name), Expected: raw, Delete: true})
	if err != nil {
		return fmt.Errorf("delete queue %q: %w", name, err)
	}
	if !res.Swapped {
		if !res.Existed {
			return errQueueNotFound
		}
		return s.deleteQueue(ctx, name) // changed meanwhile: read it again
	}
	return s.sweep(ctx, messagesPrefix(name, q.Gen))
}

// sweep deletes every record under prefix.
func (s *store) sweep(ctx context.Context, prefix []byte) error {
	for {
		var muts []client.Mutation
		err := s.tbl().ScanRange(ctx, client.RangeScan{KeyRange: client.KeyRange{Start: prefix, End: prefixEnd(prefix)}, Limit: scanChunk},
			func(k, _ []byte) error {
				muts = append(muts, client.Mutation{Key: bytes.Clone(k), Delete: true})
				return nil
			})
		if err != nil {
			return fmt.Errorf("delete messages: %w", err)
		}
		if len(muts) == 0 {
			return nil
		}
		if err := s.tbl().BatchWrite(ctx, muts); err != nil {
			return fmt.Errorf("delete messages: %w", err)
		}
	}
}

// queueItem is one queue of a listing.
type queueItem struct {
	Name     string
	Metadata []metaPair
}

// listQueues lists up to max queues whose names start with prefix, from
// marker on; next is the marker of the following page ("" at the end).
func (s *store) listQueues(ctx context.Context, prefix, marker string, limit int) (items []queueItem, next string, err error) {
	start := append(slices.Clone(queuesPrefix), prefix...)
	if m := queueKey(marker); marker != "" && bytes.Compare(m, start) > 0 {
		start = m
	}
	end := prefixEnd(append(slices.Clone(queuesPrefix), prefix...))
	if end != nil && bytes.Compare(start, end) >= 0 {
		return nil, "", nil
	}
	err = s.tbl().ScanRange(ctx, client.RangeScan{KeyRange: client.KeyRange{Start: start, End: end}, Limit: limit + 1}, func(k, v []byte) error {
		name := string(k[len(queuesPrefix):])
		if len(items) == limit {
			next = name
			return nil
		}
		q, err := decodeQueue(v)
		if err != nil {
			return fmt.Errorf("list queues: queue %q: %w", name, err)
		}
		items = append(items, queueItem{Name: name, Metadata: q.Metadata})
		return nil
	})
	if tableMissing(err) {
		return nil, "", nil
	}
	return items, next, err
}

// message is a message as an operation answers it.
type message struct {
	ID  [16]byte
	Rec *messageRecord
}

// newReceipt draws a pop receipt.
func newReceipt() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return base64.StdEncoding.EncodeToString(b[:])
}

// newMessageID is the insertion time (made to increase) then 8 random
// bytes.
func (s *store) newMessageID(now time.Time) [16]byte {
	t := now.UnixNano()
	for {
		last := s.lastID.Load()
		if t <= last {
			t = last + 1
		}
		if s.lastID.CompareAndSwap(last, t) {
			break
		}
	}
	var id [16]byte
	binary.BigEndian.PutUint64(id[:8], uint64(t))
	_, _ = rand.Read(id[8:])
	return id
}

// putMessage adds a message visible from now+visibility, expiring after
// ttl (0: never). Durable when it returns nil: the record is committed on
// the table's replicas.
func (s *store) putMessage(ctx context.Context, name, text string, visibility, ttl time.Duration) (message, error) {
	q, _, err := s.mustQueue(ctx, name)
	if err != nil {
		return message{}, err
	}
	now := s.now()
	ms := now.UnixMilli()
	rec := &messageRecord{Inserted: ms, Expires: never, Visible: ms + visibility.Milliseconds(), Receipt: newReceipt(), Text: text}
	if ttl > 0 {
		rec.Expires = ms + ttl.Milliseconds()
	}
	id := s.newMessageID(now)
	var opts []client.WriteOption
	if d := rec.ttl(ms); d > 0 {
		opts = append(opts, client.WithTTL(d))
	}
	if err := s.tbl().Put(ctx, messageKey(name, q.Gen, id), encodeMessage(rec), opts...); err != nil {
		return message{}, fmt.Errorf("put a message on queue %q: %w", name, err)
	}
	return message{ID: id, Rec: rec}, nil
}

// scanMessages calls fn with the live messages of queue (name, gen) in
// insertion order until fn returns stop.
func (s *store) scanMessages(ctx context.Context, name string, gen uint64, fn func(key []byte, raw []byte, m message) (stop bool, err error)) error {
	prefix := messagesPrefix(name, gen)
	start, end := prefix, prefixEnd(prefix)
	now := s.nowMs()
	for {
		type kv struct{ k, v []byte }
		var page []kv
		err := s.tbl().ScanRange(ctx, client.RangeScan{KeyRange: client.KeyRange{Start: start, End: end}, Limit: scanChunk}, func(k, v []byte) error {
			page = append(page, kv{bytes.Clone(k), bytes.Clone(v)})
			return nil
		})
		if err != nil {
			return fmt.Errorf("read the messages of queue %q: %w", name, err)
		}
		for _, e := range page {
			if len(e.k) != len(prefix)+16 {
				return fmt.Errorf("read the messages of queue %q: %w: key of %d bytes", name, ErrCorrupt, len(e.k))
			}
			rec, err := decodeMessage(e.v)
			if err != nil {
				return fmt.Errorf("read the messages of queue %q: %w", name, err)
			}
			if rec.expired(now) {
				continue
			}
			var id [16]byte
			copy(id[:], e.k[len(prefix):])
			stop, err := fn(e.k, e.v, message{ID: id, Rec: rec})
			if err != nil || stop {
				return err
			}
		}
		if len(page) < scanChunk {
			return nil
		}
		start = append(page[len(page)-1].k, 0)
	}
}

// getMessages dequeues up to n visible messages, making each invisible
// for visibility with a new pop receipt and one more dequeue. Each
// message's change is a compare-and-swap on the value read: of two
// consumers racing for a message, one gets it and the other moves on,
// so no message is given twice within one visibility window.
func (s *store) getMessages(ctx context.Context, name string, n int, visibility time.Duration) ([]message, error) {
	q, _, err := s.mustQueue(ctx, name)
	if err != nil {
		return nil, err
	}
	var out []message
	now := s.nowMs()
	err = s.scanMessages(ctx, name, q.Gen, func(key, raw []byte, m message) (bool, error) {
		if m.Rec.Visible > now {
			return false, nil
		}
		next := *m.Rec
		next.Visible = now + visibility.Milliseconds()
		next.Dequeues++
		next.Receipt = newReceipt()
		res, err := s.tbl().CompareAndSwap(ctx, client.CAS{Key: key, Expected: raw, Value: encodeMessage(&next), TTL: next.ttl(now)})
		if err != nil {
			return true, fmt.Errorf("dequeue a message of queue %q: %w", name, err)
		}
		if res.Swapped {
			out = append(out, message{ID: m.ID, Rec: &next})
		}
		return len(out) == n, nil
	})
	return out, err
}

// peekMessages reads up to n visible messages without changing them.
func (s *store) peekMessages(ctx context.Context, name string, n int) ([]message, error) {
	q, _, err := s.mustQueue(ctx, name)
	if err != nil {
		return nil, err
	}
	var out []message
	now := s.nowMs()
	err = s.scanMessages(ctx, name, q.Gen, func(_, _ []byte, m message) (bool, error) {
		if m.Rec.Visible <= now {
			out = append(out, m)
		}
		return len(out) == n, nil
	})
	return out, err
}

// countMessages counts the queue's unexpired messages, visible or not.
func (s *store) countMessages(ctx context.Context, name string, gen uint64) (int, error) {
	n := 0
	err := s.scanMessages(ctx, name, gen, func(_, _ []byte, _ message) (bool, error) {
		n++
		return false, nil
	})
	return n, err
}

// clearMessages deletes every message of the queue.
func (s *store) clearMessages(ctx context.Context, name string) error {
	q, _, err := s.mustQueue(ctx, name)
	if err != nil {
		return err
	}
	return s.sweep(ctx, messagesPrefix(name, q.Gen))
}

// changeMessage applies fn to message id of queue name if its pop
// receipt is receipt (MessageNotFound when there is no such live
// message, PopReceiptMismatch when it has another receipt): fn returns
// the new record, or nil to delete it.
func (s *store) changeMessage(ctx context.Context, name string, id [16]byte, receipt string, fn func(m *messageRecord, now int64) *messageRecord) (*messageRecord, error) {
	q, _, err := s.mustQueue(ctx, name)
	if err != nil {
		return nil, err
	}
	key := messageKey(name, q.Gen, id)
	for range maxSwapAttempts {
		raw, err := s.get(ctx, key)
		if err != nil {
			return nil, err
		}
		now := s.nowMs()
		if raw == nil {
			return nil, errMessageNotFound
		}
		rec, err := decodeMessage(raw)
		if err != nil {
			return nil, fmt.Errorf("read a message of queue %q: %w", name, err)
		}
		if rec.expired(now) {
			return nil, errMessageNotFound
		}
		if rec.Receipt != receipt {
			return nil, errPopReceiptMismatch
		}
		next := fn(rec, now)
		c := client.CAS{Key: key, Expected: raw, Delete: next == nil}
		if next != nil {
			c.Value, c.TTL = encodeMessage(next), next.ttl(now)
		}
		res, err := s.tbl().CompareAndSwap(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("change a message of queue %q: %w", name, err)
		}
		if res.Swapped {
			return next, nil
		}
	}
	return nil, fmt.Errorf("change a message of queue %q: still contended after %d attempts", name, maxSwapAttempts)
}

// serviceProperties reads the stored service properties (nil: none set).
func (s *store) serviceProperties(ctx context.Context) ([]byte, error) {
	raw, err := s.get(ctx, serviceKey)
	if err != nil || raw == nil {
		return nil, err
	}
	p, err := unframe(raw)
	if err != nil {
		return nil, fmt.Errorf("read the queue service properties: %w", err)
	}
	return p, nil
}

// setServiceProperties replaces what update makes of the stored service
// properties (nil when none were set), as a compare-and-swap.
func (s *store) setServiceProperties(ctx context.Context, update func(cur []byte) ([]byte, error)) error {
	if err := s.ensure(ctx); err != nil {
		return err
	}
	for range maxSwapAttempts {
		raw, err := s.get(ctx, serviceKey)
		if err != nil {
			return err
		}
		var cur []byte
		if raw != nil {
			if cur, err = unframe(raw); err != nil {
				return fmt.Errorf("read the queue service properties: %w", err)
			}
		}
		next, err := update(cur)
		if err != nil {
			return err
		}
		res, err := s.tbl().CompareAndSwap(ctx, client.CAS{Key: serviceKey, ExpectAbsent: raw == nil, Expected: raw, Value: frame(next)})
		if err != nil {
			return fmt.Errorf("write the queue service properties: %w", err)
		}
		if res.Swapped {
			return nil
		}
	}
	return fmt.Errorf("write the queue service properties: still contended after %d attempts", maxSwapAttempts)
}
