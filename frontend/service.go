package frontend

import (
	"context"
	"io"
	"net/http"

	"github.com/tabuladb/tabula/frontend/sharedkey"
)

// serviceProperties answers Get Table Service Properties: what was last
// set (defaults: nothing enabled, no CORS rules). Tools such as Storage
// Explorer read them on connecting.
func (q *request) serviceProperties(ctx context.Context) {
	if err := q.p.Allows(sharedkey.OpGetServiceProperties, "", "", ""); err != nil {
		q.fail(err)
		return
	}
	props, err := q.acct.settings.serviceProps(ctx)
	if err != nil {
		q.fail(err)
		return
	}
	q.writeXML(http.StatusOK, props.xmlBody())
}

// setServiceProperties answers Set Table Service Properties: the body's
// elements replace the stored ones, durably, before the 202.
func (q *request) setServiceProperties(ctx context.Context) {
	if err := q.p.Allows(sharedkey.OpSetServiceProperties, "", "", ""); err != nil {
		q.fail(err)
		return
	}
	body, err := io.ReadAll(io.LimitReader(q.r.Body, maxServicePropBody+1))
	if err != nil {
		q.fail(err)
		return
	}
	props, err := parseServiceProps(body)
	if err != nil {
		q.fail(err)
		return
	}
	if err := q.acct.settings.setServiceProps(ctx, props); err != nil {
		q.fail(err)
		return
	}
	q.w.Header().Set("Content-Length", "0")
	q.w.WriteHeader(http.StatusAccepted)
}

// serviceStats answers Get Table Service Stats, which the service serves
// on the secondary endpoint only. Every write is replicated before it is
// acknowledged, so the "secondary" is always live and in sync: its last
// sync time is now.
func (q *request) serviceStats() {
	if err := q.p.Allows(sharedkey.OpGetServiceStats, "", "", ""); err != nil {
		q.fail(err)
		return
	}
	if !q.p.Secondary {
		q.fail(&svcError{status: http.StatusBadRequest, code: "InvalidQueryParameterValue",
			msg: "Value for one of the query parameters specified in the request URI is invalid: service statistics are served on the secondary endpoint (account-secondary)."})
		return
	}
	body := `<?xml version="1.0" encoding="utf-8"?><StorageServiceStats><GeoReplication><Status>live</Status><LastSyncTime>` +
		q.g.opts.Now().UTC().Format(http.TimeFormat) + `</LastSyncTime></GeoReplication></StorageServiceStats>`
	q.writeXML(http.StatusOK, []byte(body))
}

// writeXML answers status with an XML body.
func (q *request) writeXML(status int, body []byte) {
	q.w.Header().Set("Content-Type", "application/xml")
	q.w.WriteHeader(status)
	_, _ = q.w.Write(body)
}
