package frontend

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/frontend/batch"
	"github.com/tabuladb/tabula/frontend/edm"
	"github.com/tabuladb/tabula/frontend/entity"
	"github.com/tabuladb/tabula/frontend/sharedkey"
)

// etagPrefix is how many leading bytes of a stored entity identify its
// version: the encoding's version byte and the Timestamp the ETag is
// made of. A batch's If-Match with an ETag, and a merge, become a
// condition that the stored value still starts with them; If-Match "*" on
// an update or delete a condition that the entity exists.
const etagPrefix = 9

// batchOp is one operation of a changeset, resolved.
type batchOp struct {
	op      batch.Op
	kind    sharedkey.Op
	k       entityKeys
	in      *edm.Entity // the body's entity (insert, update, merge)
	ifMatch string
	prefer  string
}

// batch serves an entity group transaction ($batch): one changeset of
// up to 100 operations on one table and one PartitionKey, applied all
// or nothing as one conditional batch write, or a single query.
func (q *request) batch(ctx context.Context) {
	if q.r.Method != http.MethodPost {
		q.methodNotAllowed()
		return
	}
	b, err := batch.Parse(q.r.Header.Get("Content-Type"), q.r.Body, 0)
	var be *batch.Error
	switch {
	case errors.As(err, &be) && be.Batched:
		q.batchFailure(be.Index, "", &svcError{status: be.Status, code: be.Code, msg: be.Message})
		return
	case err != nil:
		q.fail(err)
		return
	}
	if !b.Changeset {
		q.batchQuery(ctx, b.Ops[0])
		return
	}
	ops := make([]batchOp, len(b.Ops))
	var table string
	for i, op := range b.Ops {
		bo, name, err := q.resolveBatchOp(op)
		if err != nil {
			q.batchFailure(i, op.ContentID, err)
			return
		}
		switch {
		case i == 0:
			table = name
		case !strings.EqualFold(name, table):
			q.batchFailure(i, op.ContentID, &svcError{status: http.StatusBadRequest, code: "InvalidInput", msg: "All operations of a changeset must act on one table."})
			return
		case bo.k.pk != ops[0].k.pk:
			q.batchFailure(i, op.ContentID, &svcError{status: http.StatusBadRequest, code: "CommandsInBatchActOnDifferentPartitions", msg: "All commands in a batch must operate on same entity group."})
			return
		}
		for _, prev := range ops[:i] {
			if prev.k.rk == bo.k.rk {
				q.batchFailure(i, op.ContentID, &svcError{status: http.StatusBadRequest, code: "InvalidDuplicateRow", msg: "The batch request contains multiple changes with same row key. An entity can appear only once in a batch request."})
				return
			}
		}
		if err := q.p.Allows(bo.kind, name, bo.k.pk, bo.k.rk); err != nil {
			q.batchFailure(i, op.ContentID, err)
			return
		}
		ops[i] = bo
	}
	actual, ok, err := q.acct.table(ctx, table)
	switch {
	case err != nil:
		q.fail(err)
		return
	case !ok:
		q.batchFailure(0, ops[0].op.ContentID, errTableNotFound)
		return
	}
	tbl := q.acct.c.Table(actual)
	for attempt := 0; ; attempt++ {
		if err := mergeBackoff(ctx, attempt); err != nil {
			q.fail(err)
			return
		}
		results, retry, ok := q.tryBatch(ctx, tbl, table, ops, attempt < mergeRetries)
		if !ok {
			return
		}
		if retry {
			continue
		}
		q.batchResults(results)
		return
	}
}

// merging reports whether o's new value is made from the stored one.
func (o *batchOp) merging() bool {
	return o.kind == sharedkey.OpMergeEntity || o.kind == sharedkey.OpInsertOrMergeEntity
}

// tryBatch reads what the changeset's operations need and writes it as
// one conditional batch write. Each condition says what the operation
// requires: an ETag, the stored version (the value's first etagPrefix
// bytes); If-Match "*" on an update or delete, existence only; a merge,
// the version it merged into (it is made from it), or absence when it
// found none. A merge whose entity changed under it, or appeared, is no
// conflict for the caller: retry asks for the changeset again (false once
// the merge retries are spent: then it is ServerBusy). ok false: the
// answer was sent.
func (q *request) tryBatch(ctx context.Context, tbl *client.Table, table string, ops []batchOp, mayRetry bool) (results []batch.Result, retry, ok bool) {
	// The operations that need the stored entity (an ETag, or a value to
	// merge, or the Timestamp an update with "*" must follow) read it in
	// one call; the batch then holds only if none changed since.
	var need [][]byte
	var needIdx []int
	for i, o := range ops {
		if o.ifMatch != "" || o.merging() {
			need = append(need, entity.Key(o.k.pk, o.k.rk))
			needIdx = append(needIdx, i)
		}
	}
	cur := make([]*stored, len(ops))
	if len(need) > 0 {
		got, err := tbl.BatchGet(ctx, need)
		if err != nil {
			q.fail(tableErr(err))
			return nil, false, false
		}
		for j, g := range got {
			if !g.Found {
				continue
			}
			o := ops[needIdx[j]]
			e, err := entity.DecodeBinary(o.k.pk, o.k.rk, g.Value)
			if err != nil {
				q.fail(err)
				return nil, false, false
			}
			cur[needIdx[j]] = &stored{e: e, raw: g.Value}
		}
	}
	ts := q.g.stamp(maxStamp(cur))
	muts := make([]client.Mutation, len(ops))
	results = make([]batch.Result, len(ops))
	for i, o := range ops {
		key := entity.Key(o.k.pk, o.k.rk)
		c := cur[i]
		if o.ifMatch != "" {
			if c == nil {
				q.batchFailure(i, o.op.ContentID, errResourceNotFound)
				return nil, false, false
			}
			if err := matches(o.ifMatch, c); err != nil {
				q.batchFailure(i, o.op.ContentID, err)
				return nil, false, false
			}
		}
		m := client.Mutation{Key: key}
		switch {
		case o.ifMatch == "*" && !o.merging():
			m.Cond = client.Condition{Kind: client.CondPresent}
		case c != nil:
			m.Cond = client.Condition{Kind: client.CondPrefix, Prefix: c.raw[:etagPrefix]}
		case o.ifMatch != "" || o.kind == sharedkey.OpInsertEntity || o.kind == sharedkey.OpInsertOrMergeEntity:
			m.Cond = client.Condition{Kind: client.CondAbsent}
		}
		res := batch.Result{ContentID: o.op.ContentID, Status: http.StatusNoContent, Header: http.Header{}}
		if o.kind == sharedkey.OpDeleteEntity {
			m.Delete = true
		} else {
			next := o.in
			if c != nil && o.merging() {
				next = mergeProps(c.e, o.in)
			}
			next.Timestamp = ts
			if err := entity.Validate(next); err != nil {
				q.batchFailure(i, o.op.ContentID, err)
				return nil, false, false
			}
			m.Value = entity.AppendBinary(nil, next)
			res.Header.Set("ETag", entity.ETag(ts))
			if o.kind == sharedkey.OpInsertEntity || o.kind == sharedkey.OpInsertOrReplaceEntity || o.kind == sharedkey.OpInsertOrMergeEntity {
				// The entity's URL, as the service sends it: clients
				// (@azure/data-tables) read each row key from it.
				addr := entity.Address(q.base, table, o.k.pk, o.k.rk)
				res.Header.Set("Location", addr)
				res.Header.Set("DataServiceId", addr)
			}
			if o.kind == sharedkey.OpInsertEntity && !strings.Contains(strings.ToLower(o.prefer), "return-no-content") {
				md, err := entity.ParseAccept(o.op.Header.Get("Accept"), "")
				if err != nil {
					md = entity.MinimalMetadata
				}
				res.Status = http.StatusCreated
				res.Header.Set("Content-Type", md.ContentType())
				res.Body = entity.AppendJSON(nil, next, entity.JSONOptions{Metadata: md, BaseURL: q.base, Account: q.account, Table: table})
			}
		}
		muts[i] = m
		results[i] = res
	}
	err := tbl.BatchWrite(ctx, muts)
	var cf *client.ConditionFailedError
	switch {
	case errors.As(err, &cf):
		i := cf.Index
		o := ops[i]
		switch {
		case o.kind == sharedkey.OpInsertEntity:
			q.batchFailure(i, o.op.ContentID, errEntityExists)
		case o.ifMatch == "*" && !o.merging():
			// Its condition is existence only.
			q.batchFailure(i, o.op.ContentID, errResourceNotFound)
		case o.ifMatch == "" || o.ifMatch == "*":
			// A merge whose entity changed (or appeared, or went)
			// since it was read: read it again.
			if mayRetry {
				return nil, true, true
			}
			q.batchFailure(i, o.op.ContentID, &svcError{status: http.StatusServiceUnavailable, code: "ServerBusy", msg: "The entity changed under every attempt to merge into it; retry."})
		default:
			// Changed since it was read: its ETag no longer holds.
			q.batchFailure(i, o.op.ContentID, errCondition)
		}
		return nil, false, false
	case err != nil:
		q.fail(tableErr(err))
		return nil, false, false
	}
	return results, false, true
}

// batchResults answers a changeset that applied.
func (q *request) batchResults(results []batch.Result) {
	bb, cb, err := batch.NewBoundaries(rand.Reader)
	if err != nil {
		q.fail(err)
		return
	}
	var out bytes.Buffer
	if err := batch.WriteResponse(&out, bb, cb, results); err != nil {
		q.fail(err)
		return
	}
	q.w.Header().Set("Content-Type", batch.ContentType(bb))
	q.w.WriteHeader(http.StatusAccepted)
	_, _ = q.w.Write(out.Bytes())
}

// maxStamp is the latest Timestamp among the stored entities.
func maxStamp(cur []*stored) (t time.Time) {
	for _, c := range cur {
		if c != nil && c.e.Timestamp.After(t) {
			t = c.e.Timestamp
		}
	}
	return t
}

// resolveBatchOp reads one operation of a changeset: its table, keys,
// entity and conditions.
func (q *request) resolveBatchOp(op batch.Op) (batchOp, string, error) {
	bo := batchOp{op: op, ifMatch: strings.TrimSpace(op.Header.Get("If-Match")), prefer: op.Header.Get("Prefer")}
	method := op.Method
	if x := op.Header.Get("X-HTTP-Method"); x != "" && method == http.MethodPost {
		method = x
	}
	path := strings.TrimPrefix(op.URL.Path, "/")
	acct, rest, _ := strings.Cut(path, "/")
	if name, _ := strings.CutSuffix(acct, "-secondary"); name != q.account {
		return bo, "", &svcError{status: http.StatusBadRequest, code: "InvalidInput", msg: "An operation of the batch addresses another account."}
	}
	name, k, err := parseEntityPath(rest)
	if err != nil {
		return bo, "", err
	}
	bo.k = k
	switch {
	case method == http.MethodPost && !k.set:
		bo.kind = sharedkey.OpInsertEntity
	case !k.set:
		return bo, "", &svcError{status: http.StatusBadRequest, code: "InvalidInput", msg: "The operation names no entity (PartitionKey, RowKey)."}
	case method == http.MethodPut && bo.ifMatch != "":
		bo.kind = sharedkey.OpUpdateEntity
	case method == http.MethodPut:
		bo.kind = sharedkey.OpInsertOrReplaceEntity
	case (method == "MERGE" || method == http.MethodPatch) && bo.ifMatch != "":
		bo.kind = sharedkey.OpMergeEntity
	case method == "MERGE" || method == http.MethodPatch:
		bo.kind = sharedkey.OpInsertOrMergeEntity
	case method == http.MethodDelete:
		bo.kind = sharedkey.OpDeleteEntity
		if bo.ifMatch == "" {
			bo.ifMatch = "*"
		}
	default:
		return bo, "", &svcError{status: http.StatusBadRequest, code: "InvalidInput", msg: "A changeset holds inserts, updates, merges and deletes; " + method + " is not one."}
	}
	if bo.kind == sharedkey.OpDeleteEntity {
		return bo, name, nil
	}
	if bo.kind == sharedkey.OpInsertEntity {
		e, err := entity.DecodeJSON(op.Body)
		if err != nil {
			return bo, "", err
		}
		bo.in, bo.k = e, entityKeys{set: true, pk: e.PartitionKey, rk: e.RowKey}
		return bo, name, nil
	}
	e, hasPK, hasRK, err := entity.DecodeJSONKeysOptional(op.Body)
	if err != nil {
		return bo, "", err
	}
	if (hasPK && e.PartitionKey != k.pk) || (hasRK && e.RowKey != k.rk) {
		return bo, "", &svcError{status: http.StatusBadRequest, code: "InvalidInput", msg: "The keys in the request body differ from the keys in the URL."}
	}
	e.PartitionKey, e.RowKey = k.pk, k.rk
	bo.in = e
	return bo, name, nil
}

// batchFailure answers a batch whose operation index failed, as the
// service does: 202, with one part carrying the failure.
func (q *request) batchFailure(index int, contentID string, err error) {
	se := toSvc(err)
	var ae *sharedkey.Error
	if errors.As(err, &ae) {
		se = &svcError{status: ae.Status, code: ae.Code, msg: ae.Message}
	}
	bb, cb, berr := batch.NewBoundaries(rand.Reader)
	if berr != nil {
		q.fail(berr)
		return
	}
	var out bytes.Buffer
	h := http.Header{}
	h.Set("Content-Type", "application/json;odata=minimalmetadata;streaming=true;charset=utf-8")
	h.Set("x-ms-error-code", se.code)
	if werr := batch.WriteFailure(&out, bb, cb, index, batch.Result{ContentID: contentID, Status: se.status, Header: h, Body: q.errorBody(se, "")}); werr != nil {
		q.fail(werr)
		return
	}
	q.w.Header().Set("Content-Type", batch.ContentType(bb))
	q.w.WriteHeader(http.StatusAccepted)
	_, _ = q.w.Write(out.Bytes())
}

// batchQuery serves a batch whose only operation is a point query.
func (q *request) batchQuery(ctx context.Context, op batch.Op) {
	path := strings.TrimPrefix(op.URL.Path, "/")
	_, rest, _ := strings.Cut(path, "/")
	name, k, err := parseEntityPath(rest)
	if err != nil || !k.set {
		q.batchFailure(0, op.ContentID, &svcError{status: http.StatusBadRequest, code: "InvalidInput", msg: "A batch query retrieves one entity by its PartitionKey and RowKey."})
		return
	}
	if err := q.p.Allows(sharedkey.OpGetEntity, name, k.pk, k.rk); err != nil {
		q.batchFailure(0, op.ContentID, err)
		return
	}
	actual, ok, err := q.acct.table(ctx, name)
	switch {
	case err != nil:
		q.fail(err)
		return
	case !ok:
		q.batchFailure(0, op.ContentID, errTableNotFound)
		return
	}
	cur, err := read(ctx, q.acct.c.Table(actual), k)
	switch {
	case err != nil:
		q.fail(err)
		return
	case cur == nil:
		q.batchFailure(0, op.ContentID, errResourceNotFound)
		return
	}
	md, err := entity.ParseAccept(op.Header.Get("Accept"), "")
	if err != nil {
		md = entity.MinimalMetadata
	}
	h := http.Header{}
	h.Set("Content-Type", md.ContentType())
	h.Set("ETag", entity.ETag(cur.e.Timestamp))
	bb, _, err := batch.NewBoundaries(rand.Reader)
	if err != nil {
		q.fail(err)
		return
	}
	var out bytes.Buffer
	res := batch.Result{ContentID: op.ContentID, Status: http.StatusOK, Header: h,
		Body: entity.AppendJSON(nil, cur.e, entity.JSONOptions{Metadata: md, BaseURL: q.base, Account: q.account, Table: name})}
	if err := batch.WriteResponse(&out, bb, "", []batch.Result{res}); err != nil {
		q.fail(err)
		return
	}
	q.w.Header().Set("Content-Type", batch.ContentType(bb))
	q.w.WriteHeader(http.StatusAccepted)
	_, _ = q.w.Write(out.Bytes())
}
