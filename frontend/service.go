package frontend

import (
	"context"
	"net/http"

	"github.com/tabuladb/tabula/frontend/sharedkey"
)

// serviceProperties answers Get Service Properties with what this
// gateway does: no Storage Analytics logging or metrics, no CORS rules.
// Tools such as Storage Explorer read them on connecting.
func (q *request) serviceProperties() {
	if err := q.p.Allows(sharedkey.OpGetServiceProperties, "", "", ""); err != nil {
		q.fail(err)
		return
	}
	const body = `<?xml version="1.0" encoding="utf-8"?><StorageServiceProperties>` +
		`<Logging><Version>1.0</Version><Delete>false</Delete><Read>false</Read><Write>false</Write><RetentionPolicy><Enabled>false</Enabled></RetentionPolicy></Logging>` +
		`<HourMetrics><Version>1.0</Version><Enabled>false</Enabled><RetentionPolicy><Enabled>false</Enabled></RetentionPolicy></HourMetrics>` +
		`<MinuteMetrics><Version>1.0</Version><Enabled>false</Enabled><RetentionPolicy><Enabled>false</Enabled></RetentionPolicy></MinuteMetrics>` +
		`<Cors /></StorageServiceProperties>`
	q.w.Header().Set("Content-Type", "application/xml")
	q.w.WriteHeader(http.StatusOK)
	_, _ = q.w.Write([]byte(body))
}

// tableACL answers Get Table ACL: this gateway keeps no stored access
// policies, so every table's list is empty.
func (q *request) tableACL(ctx context.Context, name string) {
	if err := q.p.Allows(sharedkey.OpGetTableACL, name, "", ""); err != nil {
		q.fail(err)
		return
	}
	if _, ok, err := q.acct.table(ctx, name); err != nil {
		q.fail(err)
		return
	} else if !ok {
		q.fail(errResourceNotFound)
		return
	}
	q.w.Header().Set("Content-Type", "application/xml")
	q.w.WriteHeader(http.StatusOK)
	_, _ = q.w.Write([]byte(`<?xml version="1.0" encoding="utf-8"?><SignedIdentifiers />`))
}
