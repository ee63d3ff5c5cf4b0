package frontend

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/frontend/edm"
	"github.com/tabuladb/tabula/frontend/entity"
	"github.com/tabuladb/tabula/frontend/odata"
	"github.com/tabuladb/tabula/frontend/sharedkey"
)

// maxEntityBody bounds an entity's JSON body: the 1 MiB entity limit is
// counted on the stored form, and JSON (base64, annotations, escapes)
// can take several times that.
const maxEntityBody = 4 << 20

// mergeRetries bounds how often a merge (Insert Or Merge, or Merge with
// If-Match "*", alone or in a batch) re-reads an entity another writer
// changed under it; then it answers 503 ServerBusy, never 412.
const mergeRetries = 32

// mergeBackoff waits before attempt (from 0; the first does not wait) of
// a merge: a random time below 1 ms << (attempt-1), at most 256 ms, so
// merges racing on one entity spread out rather than collide again. 16
// writers updating and merging into one entity: with no wait 124 of 160
// merges spent their 16 attempts (ServerBusy); with waits of at most 64
// ms, 4. All 32 attempts wait at most ~6 s, under the client's timeout.
func mergeBackoff(ctx context.Context, attempt int) error {
	if attempt == 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(rand.Int64N(int64(time.Millisecond << min(attempt-1, 8)))))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Query pages end at MaxPageSize entities, after scanExamine records
// read, or after scanBudget, whichever comes first, as the service's do
// (1,000 entities, 5 s); a page may then hold fewer, even none, and a
// continuation.
const (
	scanExamine = 10_000
	scanBudget  = 5 * time.Second
)

// stored is an entity as the table holds it.
type stored struct {
	e   *edm.Entity
	raw []byte // the value bytes (its first 9 hold the version and Timestamp: the ETag)
}

// entityOp serves a request to table name (keys: one entity, or none).
func (q *request) entityOp(ctx context.Context, name string, k entityKeys) {
	method := q.r.Method
	if x := q.r.Header.Get("X-HTTP-Method"); x != "" {
		if method != http.MethodPost {
			q.fail(&svcError{status: http.StatusBadRequest, code: "XMethodNotUsingPost", msg: "The request uses X-HTTP-Method with an HTTP verb other than POST."})
			return
		}
		if x != "MERGE" && x != "DELETE" && x != "PUT" && x != "PATCH" {
			q.fail(&svcError{status: http.StatusBadRequest, code: "XMethodIncorrectValue", msg: "The value specified for X-HTTP-Method is not valid."})
			return
		}
		method = x
	}
	actual, ok, err := q.acct.table(ctx, name)
	switch {
	case err != nil:
		q.fail(err)
		return
	case !ok:
		q.fail(errTableNotFound)
		return
	}
	tbl := q.acct.c.Table(actual)
	switch {
	case method == http.MethodGet && k.set:
		q.getEntity(ctx, tbl, name, k)
	case method == http.MethodGet:
		q.queryEntities(ctx, tbl, name)
	case method == http.MethodPost && !k.set:
		q.insertEntity(ctx, tbl, name)
	case !k.set:
		q.methodNotAllowed()
	case method == http.MethodPut:
		q.writeEntity(ctx, tbl, k, false)
	case method == "MERGE" || method == http.MethodPatch:
		q.writeEntity(ctx, tbl, k, true)
	case method == http.MethodDelete:
		q.deleteEntity(ctx, tbl, k)
	default:
		q.methodNotAllowed()
	}
}

// read returns the entity at k, nil when absent.
func read(ctx context.Context, tbl *client.Table, k entityKeys) (*stored, error) {
	v, err := tbl.Get(ctx, entity.Key(k.pk, k.rk))
	if errors.Is(err, client.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, tableErr(err)
	}
	e, err := entity.DecodeBinary(k.pk, k.rk, v)
	if err != nil {
		return nil, err
	}
	return &stored{e: e, raw: v}, nil
}

// tableErr turns a table that vanished into TableNotFound.
func tableErr(err error) error {
	if api.CodeOf(err) == api.ErrorCode_ERROR_CODE_NOT_FOUND {
		return errTableNotFound
	}
	return err
}

// body reads the request body, at most limit bytes.
func (q *request) body(limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(q.r.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, &svcError{status: http.StatusRequestEntityTooLarge, code: "RequestBodyTooLarge", msg: "The request body is too large and exceeds the maximum permissible limit."}
	}
	return b, nil
}

// ifMatch reads If-Match: "" when absent, "*", or an ETag.
func (q *request) ifMatch() string { return strings.TrimSpace(q.r.Header.Get("If-Match")) }

// matches checks an If-Match value against the stored entity.
func matches(ifMatch string, cur *stored) error {
	if ifMatch == "*" {
		return nil
	}
	ts, err := entity.ParseETag(ifMatch)
	if errors.Is(err, entity.ErrUpdateConditionNotSatisfied) {
		return errCondition // a weak ETag not of our form matches nothing
	}
	if err != nil {
		return &svcError{status: http.StatusBadRequest, code: "InvalidInput", msg: "The If-Match header is not a valid ETag: " + err.Error()}
	}
	if !ts.Equal(cur.e.Timestamp) {
		return errCondition
	}
	return nil
}

func (q *request) getEntity(ctx context.Context, tbl *client.Table, name string, k entityKeys) {
	if err := q.p.Allows(sharedkey.OpGetEntity, name, k.pk, k.rk); err != nil {
		q.fail(err)
		return
	}
	m, err := q.metadata()
	if err != nil {
		q.fail(err)
		return
	}
	sel, err := odata.ParseSelect(q.r.URL.Query().Get("$select"))
	if err != nil {
		q.fail(err)
		return
	}
	cur, err := read(ctx, tbl, k)
	switch {
	case err != nil:
		q.fail(err)
		return
	case cur == nil:
		q.fail(errResourceNotFound)
		return
	}
	q.w.Header().Set("ETag", entity.ETag(cur.e.Timestamp))
	q.writeJSON(http.StatusOK, m, entity.AppendJSON(nil, cur.e, entity.JSONOptions{Metadata: m, BaseURL: q.base, Account: q.account, Table: name, Select: sel}))
}

func (q *request) insertEntity(ctx context.Context, tbl *client.Table, name string) {
	m, err := q.metadata()
	if err != nil {
		q.fail(err)
		return
	}
	b, err := q.body(maxEntityBody)
	if err != nil {
		q.fail(err)
		return
	}
	e, err := entity.DecodeJSON(b)
	if err != nil {
		q.fail(err)
		return
	}
	if err := q.p.Allows(sharedkey.OpInsertEntity, name, e.PartitionKey, e.RowKey); err != nil {
		q.fail(err)
		return
	}
	e.Timestamp = q.g.stamp(time.Time{})
	if err := entity.Validate(e); err != nil {
		q.fail(err)
		return
	}
	res, err := tbl.CompareAndSwap(ctx, client.CAS{Key: entity.Key(e.PartitionKey, e.RowKey), ExpectAbsent: true, Value: entity.AppendBinary(nil, e)})
	switch {
	case err != nil:
		q.fail(tableErr(err))
		return
	case !res.Swapped:
		q.fail(errEntityExists)
		return
	}
	q.w.Header().Set("ETag", entity.ETag(e.Timestamp))
	if q.preferNoContent() {
		q.w.WriteHeader(http.StatusNoContent)
		return
	}
	q.writeJSON(http.StatusCreated, m, entity.AppendJSON(nil, e, entity.JSONOptions{Metadata: m, BaseURL: q.base, Account: q.account, Table: name}))
}

// writeEntity serves Update (If-Match), Insert Or Replace (none), Merge
// (If-Match) and Insert Or Merge (none).
func (q *request) writeEntity(ctx context.Context, tbl *client.Table, k entityKeys, merge bool) {
	b, err := q.body(maxEntityBody)
	if err != nil {
		q.fail(err)
		return
	}
	in, hasPK, hasRK, err := entity.DecodeJSONKeysOptional(b)
	if err != nil {
		q.fail(err)
		return
	}
	if (hasPK && in.PartitionKey != k.pk) || (hasRK && in.RowKey != k.rk) {
		q.fail(&svcError{status: http.StatusBadRequest, code: "InvalidInput", msg: "The keys in the request body differ from the keys in the URL."})
		return
	}
	in.PartitionKey, in.RowKey = k.pk, k.rk
	ifMatch := q.ifMatch()
	op := map[[2]bool]sharedkey.Op{{false, true}: sharedkey.OpUpdateEntity, {false, false}: sharedkey.OpInsertOrReplaceEntity,
		{true, true}: sharedkey.OpMergeEntity, {true, false}: sharedkey.OpInsertOrMergeEntity}[[2]bool{merge, ifMatch != ""}]
	if err := q.p.Allows(op, tbl.Name(), k.pk, k.rk); err != nil {
		q.fail(err)
		return
	}
	key := entity.Key(k.pk, k.rk)
	if ifMatch == "" && !merge {
		// Insert Or Replace: no read needed.
		in.Timestamp = q.g.stamp(time.Time{})
		if err := entity.Validate(in); err != nil {
			q.fail(err)
			return
		}
		if err := tbl.Put(ctx, key, entity.AppendBinary(nil, in)); err != nil {
			q.fail(tableErr(err))
			return
		}
		q.w.Header().Set("ETag", entity.ETag(in.Timestamp))
		q.w.WriteHeader(http.StatusNoContent)
		return
	}
	if ifMatch == "*" && !merge {
		q.replaceExisting(ctx, tbl, k, in)
		return
	}
	// Merges, and updates with an ETag, are compare-and-swaps of the
	// stored bytes: a merge's result depends on them, an ETag names them.
	cur, err := read(ctx, tbl, k)
	if err != nil {
		q.fail(err)
		return
	}
	for attempt := 0; ; attempt++ {
		if err := mergeBackoff(ctx, attempt); err != nil {
			q.fail(err)
			return
		}
		next := in
		cas := client.CAS{Key: key}
		switch {
		case cur == nil && ifMatch != "":
			q.fail(errResourceNotFound)
			return
		case cur == nil:
			cas.ExpectAbsent = true
		default:
			if ifMatch != "" {
				if err := matches(ifMatch, cur); err != nil {
					q.fail(err)
					return
				}
			}
			cas.Expected = cur.raw
			if merge {
				next = mergeProps(cur.e, in)
			}
		}
		var prev time.Time
		if cur != nil {
			prev = cur.e.Timestamp
		}
		next.Timestamp = q.g.stamp(prev)
		if err := entity.Validate(next); err != nil {
			q.fail(err)
			return
		}
		cas.Value = entity.AppendBinary(nil, next)
		res, err := tbl.CompareAndSwap(ctx, cas)
		switch {
		case err != nil:
			q.fail(tableErr(err))
			return
		case res.Swapped:
			q.w.Header().Set("ETag", entity.ETag(next.Timestamp))
			q.w.WriteHeader(http.StatusNoContent)
			return
		case ifMatch == "*" && !res.Existed:
			// Deleted between the read and the swap.
			q.fail(errResourceNotFound)
			return
		case ifMatch != "" && ifMatch != "*":
			// Changed between the read and the swap: the ETag the
			// caller gave no longer holds.
			q.fail(errCondition)
			return
		case attempt >= mergeRetries:
			q.fail(&svcError{status: http.StatusServiceUnavailable, code: "ServerBusy", msg: "The entity changed under every attempt to merge into it; retry."})
			return
		}
		// The swap found another state: merge into that one, with no
		// second read.
		cur = nil
		if res.Existed {
			e, err := entity.DecodeBinary(k.pk, k.rk, res.Current)
			if err != nil {
				q.fail(err)
				return
			}
			cur = &stored{e: e, raw: res.Current}
		}
	}
}

// replaceExisting serves Update with If-Match "*": replace the entity if
// it exists, whatever its value. That is a condition on existence only,
// checked atomically with the write (a batch write of one conditional
// put), so a concurrent change is no conflict: the service never answers
// 412 to "*" on an entity that exists. The read gives the stored
// Timestamp, which the new one must follow.
func (q *request) replaceExisting(ctx context.Context, tbl *client.Table, k entityKeys, in *edm.Entity) {
	cur, err := read(ctx, tbl, k)
	switch {
	case err != nil:
		q.fail(err)
		return
	case cur == nil:
		q.fail(errResourceNotFound)
		return
	}
	in.Timestamp = q.g.stamp(cur.e.Timestamp)
	if err := entity.Validate(in); err != nil {
		q.fail(err)
		return
	}
	err = tbl.BatchWrite(ctx, []client.Mutation{{Key: entity.Key(k.pk, k.rk), Value: entity.AppendBinary(nil, in), Cond: client.Condition{Kind: client.CondPresent}}})
	var cf *client.ConditionFailedError
	switch {
	case errors.As(err, &cf):
		q.fail(errResourceNotFound) // deleted since the read
		return
	case err != nil:
		q.fail(tableErr(err))
		return
	}
	q.w.Header().Set("ETag", entity.ETag(in.Timestamp))
	q.w.WriteHeader(http.StatusNoContent)
}

// mergeProps is cur with in's properties written over it (Merge).
func mergeProps(cur, in *edm.Entity) *edm.Entity {
	out := &edm.Entity{PartitionKey: cur.PartitionKey, RowKey: cur.RowKey, Props: make([]edm.Property, 0, len(cur.Props)+len(in.Props))}
	idx := map[string]int{}
	for _, p := range cur.Props {
		idx[p.Name] = len(out.Props)
		out.Props = append(out.Props, p)
	}
	for _, p := range in.Props {
		if i, ok := idx[p.Name]; ok {
			out.Props[i] = p
			continue
		}
		out.Props = append(out.Props, p)
	}
	return out
}

func (q *request) deleteEntity(ctx context.Context, tbl *client.Table, k entityKeys) {
	if err := q.p.Allows(sharedkey.OpDeleteEntity, tbl.Name(), k.pk, k.rk); err != nil {
		q.fail(err)
		return
	}
	ifMatch := q.ifMatch()
	if ifMatch == "" || ifMatch == "*" {
		// Delete if it exists, whatever its value: a condition on
		// existence, so a concurrent update is no conflict.
		err := tbl.BatchWrite(ctx, []client.Mutation{{Key: entity.Key(k.pk, k.rk), Delete: true, Cond: client.Condition{Kind: client.CondPresent}}})
		var cf *client.ConditionFailedError
		switch {
		case errors.As(err, &cf):
			q.fail(errResourceNotFound)
		case err != nil:
			q.fail(tableErr(err))
		default:
			q.w.WriteHeader(http.StatusNoContent)
		}
		return
	}
	cur, err := read(ctx, tbl, k)
	switch {
	case err != nil:
		q.fail(err)
		return
	case cur == nil:
		q.fail(errResourceNotFound)
		return
	}
	if err := matches(ifMatch, cur); err != nil {
		q.fail(err)
		return
	}
	res, err := tbl.CompareAndSwap(ctx, client.CAS{Key: entity.Key(k.pk, k.rk), Expected: cur.raw, Delete: true})
	switch {
	case err != nil:
		q.fail(tableErr(err))
	case !res.Swapped && !res.Existed:
		q.fail(errResourceNotFound)
	case !res.Swapped:
		q.fail(errCondition)
	default:
		q.w.WriteHeader(http.StatusNoContent)
	}
}

// scanBounds are the engine keys [start, end) a filter's key range
// confines a query to (nil: unbounded).
func scanBounds(r odata.Range) (start, end []byte) {
	if pk, ok := r.Partition(); ok {
		start, end = entity.PartitionPrefix(pk), entity.PartitionEnd(pk)
		if b := r.RowLow; b.Set {
			start = entity.Key(pk, b.Key)
			if !b.Inclusive {
				start = append(start, 0)
			}
		}
		if b := r.RowHigh; b.Set {
			end = entity.Key(pk, b.Key)
			if b.Inclusive {
				end = append(end, 0)
			}
		}
		return start, end
	}
	if b := r.PartitionLow; b.Set {
		start = entity.PartitionPrefix(b.Key)
		if !b.Inclusive {
			start = entity.PartitionEnd(b.Key)
		}
	}
	if b := r.PartitionHigh; b.Set {
		end = entity.PartitionEnd(b.Key)
		if !b.Inclusive {
			end = entity.PartitionPrefix(b.Key)
		}
	}
	return start, end
}

// queryEntities serves Query Entities: the entities $filter matches, in
// key order, a page at a time ($top, NextPartitionKey/NextRowKey).
func (q *request) queryEntities(ctx context.Context, tbl *client.Table, name string) {
	if err := q.p.Allows(sharedkey.OpQueryEntities, name, "", ""); err != nil {
		q.fail(err)
		return
	}
	m, f, top, err := q.queryOptions()
	if err != nil {
		q.fail(err)
		return
	}
	qs := q.r.URL.Query()
	sel, err := odata.ParseSelect(qs.Get("$select"))
	if err != nil {
		q.fail(err)
		return
	}
	kr := f.KeyRange()
	var page []*edm.Entity
	if !kr.Empty {
		start, end := scanBounds(kr)
		if npk := qs.Get("NextPartitionKey"); npk != "" {
			pk, err1 := base64.RawURLEncoding.DecodeString(npk)
			rk, err2 := base64.RawURLEncoding.DecodeString(qs.Get("NextRowKey"))
			if err1 != nil || err2 != nil {
				q.fail(&svcError{status: http.StatusBadRequest, code: "InvalidInput", msg: "The continuation token (NextPartitionKey, NextRowKey) is not one this service gave."})
				return
			}
			if from := entity.Key(string(pk), string(rk)); bytes.Compare(from, start) > 0 {
				start = from
			}
		}
		if end != nil && bytes.Compare(start, end) >= 0 {
			start, end = nil, nil
			kr.Empty = true
		}
		if !kr.Empty {
			var nextKey []byte
			examined := 0
			deadline := time.Now().Add(scanBudget)
			errStop := errors.New("page full")
			err = tbl.ScanRange(ctx, client.RangeScan{KeyRange: client.KeyRange{Start: start, End: end}}, func(key, value []byte) error {
				if len(page) >= top || examined >= scanExamine || (examined%256 == 255 && time.Now().After(deadline)) {
					nextKey = append([]byte(nil), key...)
					return errStop
				}
				examined++
				pk, rk, err := entity.SplitKey(key)
				if err != nil {
					return err
				}
				e, err := entity.DecodeBinary(pk, rk, value)
				if err != nil {
					return err
				}
				if f.Match(e) {
					page = append(page, e)
				}
				return nil
			})
			if err != nil && !errors.Is(err, errStop) {
				q.fail(tableErr(err))
				return
			}
			if nextKey != nil {
				pk, rk, _ := entity.SplitKey(nextKey)
				q.w.Header().Set("x-ms-continuation-NextPartitionKey", base64.RawURLEncoding.EncodeToString([]byte(pk)))
				q.w.Header().Set("x-ms-continuation-NextRowKey", base64.RawURLEncoding.EncodeToString([]byte(rk)))
			}
		}
	}
	q.writeJSON(http.StatusOK, m, entity.AppendFeed(nil, page, entity.JSONOptions{Metadata: m, BaseURL: q.base, Account: q.account, Table: name, Select: sel}))
}
