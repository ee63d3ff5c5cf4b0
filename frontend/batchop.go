package frontend

import (
	"context"
	"net/http"
)

// batch serves an entity group transaction ($batch).
func (q *request) batch(ctx context.Context) {
	q.fail(&svcError{status: http.StatusNotImplemented, code: "NotImplemented", msg: "Entity group transactions are not implemented yet by this gateway."})
}
