package frontend

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/frontend/edm"
	"github.com/tabuladb/tabula/frontend/entity"
	"github.com/tabuladb/tabula/frontend/odata"
	"github.com/tabuladb/tabula/frontend/sharedkey"
)

// maxTableBody bounds a Create Table body ({"TableName": "..."}).
const maxTableBody = 64 << 10

// metadata is the response's metadata level (Accept, $format).
func (q *request) metadata() (entity.Metadata, error) {
	return entity.ParseAccept(q.r.Header.Get("Accept"), q.r.URL.Query().Get("$format"))
}

// preferNoContent reads Prefer: return-no-content (and sets
// Preference-Applied when a preference is given).
func (q *request) preferNoContent() bool {
	switch p := strings.ToLower(q.r.Header.Get("Prefer")); {
	case strings.Contains(p, "return-no-content"):
		q.w.Header().Set("Preference-Applied", "return-no-content")
		return true
	case strings.Contains(p, "return-content"):
		q.w.Header().Set("Preference-Applied", "return-content")
	}
	return false
}

// queryOptions reads a query's metadata level, $filter and $top (a page
// at most MaxPageSize).
func (q *request) queryOptions() (entity.Metadata, *odata.Filter, int, error) {
	m, err := q.metadata()
	if err != nil {
		return m, nil, 0, err
	}
	qs := q.r.URL.Query()
	f, err := odata.ParseFilter(qs.Get("$filter"))
	if err != nil {
		return m, nil, 0, err
	}
	top := odata.MaxPageSize
	if s := qs.Get("$top"); s != "" {
		if top, err = odata.ParseTop(s); err != nil {
			return m, nil, 0, err
		}
	}
	return m, f, top, nil
}

// tableJSON is one table's JSON at metadata level m.
func (q *request) tableJSON(name string, m entity.Metadata, single bool) map[string]any {
	out := map[string]any{}
	if m != entity.NoMetadata && single {
		out["odata.metadata"] = q.base + "/$metadata#Tables/@Element"
	}
	if m == entity.FullMetadata {
		out["odata.type"] = q.account + ".Tables"
		out["odata.id"] = q.base + "/Tables('" + name + "')"
		out["odata.editLink"] = "Tables('" + name + "')"
	}
	out["TableName"] = name
	return out
}

func (q *request) createTable(ctx context.Context) {
	if err := q.p.Allows(sharedkey.OpCreateTable, "", "", ""); err != nil {
		q.fail(err)
		return
	}
	m, err := q.metadata()
	if err != nil {
		q.fail(err)
		return
	}
	body, err := io.ReadAll(io.LimitReader(q.r.Body, maxTableBody+1))
	if err != nil {
		q.fail(err)
		return
	}
	var req struct {
		TableName string `json:"TableName"`
	}
	if len(body) > maxTableBody || json.Unmarshal(body, &req) != nil {
		q.fail(&svcError{status: http.StatusBadRequest, code: "InvalidInput", msg: "The request body is not a table: want {\"TableName\": \"name\"}."})
		return
	}
	if err := entity.ValidateTableName(req.TableName); err != nil {
		q.fail(err)
		return
	}
	if _, ok, err := q.acct.tableFresh(ctx, req.TableName); err != nil {
		q.fail(err)
		return
	} else if ok {
		q.fail(errTableExists)
		return
	}
	if _, err := q.acct.c.CreateTable(ctx, req.TableName, api.TableKind_TABLE_KIND_ORDERED, &api.TableOptions{}); err != nil {
		q.fail(err)
		return
	}
	// Another gateway may have created the name in another case at the
	// same time: the older table is the one (account.list), and the
	// younger's creator drops it and answers as the service would.
	if actual, ok, err := q.acct.tableFresh(ctx, req.TableName); err != nil {
		q.fail(err)
		return
	} else if ok && actual != req.TableName {
		if derr := q.acct.c.DropTable(ctx, req.TableName); derr != nil {
			q.fail(derr)
			return
		}
		q.fail(errTableExists)
		return
	}
	// Policies a dropped table of this name left behind (its drop
	// failed to remove them) must not apply to the new table.
	if err := q.acct.settings.setACL(ctx, req.TableName, nil); err != nil {
		q.fail(err)
		return
	}
	q.acct.remember(req.TableName)
	if q.preferNoContent() {
		q.w.WriteHeader(http.StatusNoContent)
		return
	}
	b, _ := json.Marshal(q.tableJSON(req.TableName, m, true))
	q.writeJSON(http.StatusCreated, m, b)
}

func (q *request) deleteTable(ctx context.Context, name string) {
	if err := q.p.Allows(sharedkey.OpDeleteTable, name, "", ""); err != nil {
		q.fail(err)
		return
	}
	actual, ok, err := q.acct.table(ctx, name)
	switch {
	case err != nil:
		q.fail(err)
		return
	case !ok:
		q.fail(errResourceNotFound)
		return
	}
	if err := q.acct.c.DropTable(ctx, actual); err != nil {
		if api.CodeOf(err) == api.ErrorCode_ERROR_CODE_NOT_FOUND {
			q.acct.forget(actual)
		}
		q.fail(err)
		return
	}
	q.acct.forget(actual)
	// The table's stored access policies go with it (a table made
	// again by the name starts with none; createTable clears them too,
	// should this fail).
	if err := q.acct.settings.setACL(ctx, actual, nil); err != nil {
		q.g.log.Warn("could not remove a dropped table's stored access policies", "table", actual, "err", err)
	}
	q.w.WriteHeader(http.StatusNoContent)
}

func (q *request) getTable(ctx context.Context, name string) {
	if err := q.p.Allows(sharedkey.OpQueryTables, name, "", ""); err != nil {
		q.fail(err)
		return
	}
	m, err := q.metadata()
	if err != nil {
		q.fail(err)
		return
	}
	actual, ok, err := q.acct.tableFresh(ctx, name)
	switch {
	case err != nil:
		q.fail(err)
		return
	case !ok:
		q.fail(errResourceNotFound)
		return
	}
	b, _ := json.Marshal(q.tableJSON(actual, m, true))
	q.writeJSON(http.StatusOK, m, b)
}

// queryTables lists the account's tables in name order, a page at a
// time ($top, NextTableName), filtered by $filter over TableName.
func (q *request) queryTables(ctx context.Context) {
	if err := q.p.Allows(sharedkey.OpQueryTables, "", "", ""); err != nil {
		q.fail(err)
		return
	}
	m, f, top, err := q.queryOptions()
	if err != nil {
		q.fail(err)
		return
	}
	qs := q.r.URL.Query()
	if err := q.acct.list(ctx); err != nil {
		q.fail(err)
		return
	}
	q.acct.mu.Lock()
	var names []string
	for _, n := range q.acct.tables {
		names = append(names, n)
	}
	q.acct.mu.Unlock()
	slices.Sort(names)
	next := qs.Get("NextTableName")
	var page []map[string]any
	more := ""
	for _, n := range names {
		if next != "" && n < next {
			continue
		}
		if !f.Match(&edm.Entity{Props: []edm.Property{{Name: "TableName", Value: edm.Str(n)}}}) {
			continue
		}
		if len(page) == top {
			more = n
			break
		}
		page = append(page, q.tableJSON(n, m, false))
	}
	if more != "" {
		q.w.Header().Set("x-ms-continuation-NextTableName", more)
	}
	out := map[string]any{"value": page}
	if page == nil {
		out["value"] = []any{}
	}
	if m != entity.NoMetadata {
		out["odata.metadata"] = q.base + "/$metadata#Tables"
	}
	b, _ := json.Marshal(out)
	q.writeJSON(http.StatusOK, m, b)
}

// itoa is strconv.Itoa.
func itoa(n int) string { return strconv.Itoa(n) }
