package frontend_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// ifMatchBatch is a changeset whose operations carry If-Match: *.
func ifMatchBatch(host string, ops []string) (contentType, body string) {
	var b strings.Builder
	b.WriteString("--batch_b1\r\nContent-Type: multipart/mixed; boundary=changeset_c1\r\n\r\n")
	for i, op := range ops {
		method, rest, _ := strings.Cut(op, " ")
		path, payload, _ := strings.Cut(rest, " ")
		fmt.Fprintf(&b, "--changeset_c1\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n")
		fmt.Fprintf(&b, "%s %s%s HTTP/1.1\r\nAccept: application/json;odata=minimalmetadata\r\nContent-Type: application/json\r\nContent-ID: %d\r\nIf-Match: *\r\n", method, host, path, i+1)
		fmt.Fprintf(&b, "\r\n%s\r\n", payload)
	}
	b.WriteString("--changeset_c1--\r\n--batch_b1--\r\n")
	return "multipart/mixed; boundary=batch_b1", b.String()
}

// TestGatewayIfMatchStarContended: If-Match "*" means "exists, whatever
// its value", so concurrent updates, merges and deletes of one entity with
// it never answer 412 while the entity exists (the service never does;
// the gateway answered 412 to 112 of 160 concurrent updates when "*" was
// a compare-and-swap of the bytes it had read). Alone and in batches. A
// merge is a read-modify-write: among writers that never wait it may give
// up (503 ServerBusy); among merges alone, which back off, none fails and
// none is lost. An entity that does not exist is 404 ResourceNotFound.
func TestGatewayIfMatchStarContended(t *testing.T) {
	a := startGateway(t)
	st, h, b := a.do("POST", "/Tables", nil, map[string]string{"TableName": "Hot"})
	a.want("create table", 201, "", st, h, b)
	st, h, b = a.do("POST", "/Hot", nil, map[string]any{"PartitionKey": "p", "RowKey": "r", "N": 0})
	a.want("insert", 201, "", st, h, b)
	st, h, b = a.do("POST", "/Hot", nil, map[string]any{"PartitionKey": "p", "RowKey": "s", "N": 0})
	a.want("insert", 201, "", st, h, b)
	host := strings.TrimSuffix(a.url, "/acct")
	star := map[string]string{"If-Match": "*"}

	type outcome struct {
		what   string
		status int
		code   string
		body   string
	}
	var mu sync.Mutex
	var bad []outcome
	counts := map[string]int{}
	note := func(what string, status int, code string, body []byte, ok bool) {
		mu.Lock()
		defer mu.Unlock()
		counts[what]++
		if !ok {
			bad = append(bad, outcome{what, status, code, string(body)})
		}
	}
	const workers, each = 16, 10 // 160 of each kind
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				n := w*each + i
				st, h, b := a.do("PUT", "/Hot(PartitionKey='p',RowKey='r')", star, map[string]any{"N": n, "W": w})
				note("update", st, h.Get("x-ms-error-code"), b, st == http.StatusNoContent)
				st, h, b = a.do("MERGE", "/Hot(PartitionKey='p',RowKey='r')", star, map[string]any{fmt.Sprintf("M%d", w): n})
				// A merge is read-modify-write: against updates that never
				// wait it may spend its attempts (503 ServerBusy, which
				// clients retry), but it is never 412.
				note("merge", st, h.Get("x-ms-error-code"), b, st == http.StatusNoContent || st == http.StatusServiceUnavailable)
				if i%2 == 0 {
					ct, body := ifMatchBatch(host, []string{
						fmt.Sprintf(`PUT /acct/Hot(PartitionKey='p',RowKey='s') {"N":%d}`, n),
						fmt.Sprintf(`MERGE /acct/Hot(PartitionKey='p',RowKey='r') {"B%d":%d}`, w, n),
					})
					st, h, b = a.do("POST", "/$batch", map[string]string{"Content-Type": ct}, body)
					note("batch", st, h.Get("x-ms-error-code"), b, st == http.StatusAccepted && !strings.Contains(string(b), "HTTP/1.1 412") &&
						(strings.Count(string(b), "HTTP/1.1 204") == 2 || strings.Contains(string(b), "HTTP/1.1 503")))
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("answered: %v", counts)
	if len(bad) > 0 {
		t.Fatalf("%d of the If-Match * writes to an existing entity failed; first: %+v", len(bad), bad[0])
	}
	// Merges alone: none is lost (each worker merges its own properties,
	// alone and in batches, into the entity the others change too).
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 4 {
				st, h, b := a.do("MERGE", "/Hot(PartitionKey='p',RowKey='r')", star, map[string]any{fmt.Sprintf("X%d_%d", w, i): i})
				note("merge only", st, h.Get("x-ms-error-code"), b, st == http.StatusNoContent)
			}
			ct, body := ifMatchBatch(host, []string{fmt.Sprintf(`MERGE /acct/Hot(PartitionKey='p',RowKey='r') {"Y%d":1}`, w)})
			st, h, b := a.do("POST", "/$batch", map[string]string{"Content-Type": ct}, body)
			note("merge only batch", st, h.Get("x-ms-error-code"), b, st == http.StatusAccepted && strings.Count(string(b), "HTTP/1.1 204") == 1)
		}()
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d of the If-Match * merges into an existing entity failed; first: %+v", len(bad), bad[0])
	}
	_, _, b = a.do("GET", "/Hot(PartitionKey='p',RowKey='r')", nil, nil)
	for w := range workers {
		for i := range 4 {
			if !strings.Contains(string(b), fmt.Sprintf(`"X%d_%d":`, w, i)) {
				t.Fatalf("worker %d's merge %d is lost: %s", w, i, b)
			}
		}
		if !strings.Contains(string(b), fmt.Sprintf(`"Y%d":`, w)) {
			t.Fatalf("worker %d's batch merge is lost: %s", w, b)
		}
	}

	// Missing entities: 404 ResourceNotFound, alone and in a batch.
	st, h, b = a.do("PUT", "/Hot(PartitionKey='p',RowKey='gone')", star, map[string]any{"N": 1})
	a.want("update * of a missing entity", 404, "ResourceNotFound", st, h, b)
	st, h, b = a.do("MERGE", "/Hot(PartitionKey='p',RowKey='gone')", star, map[string]any{"N": 1})
	a.want("merge * of a missing entity", 404, "ResourceNotFound", st, h, b)
	st, h, b = a.do("DELETE", "/Hot(PartitionKey='p',RowKey='gone')", star, nil)
	a.want("delete * of a missing entity", 404, "ResourceNotFound", st, h, b)
	ct, body := ifMatchBatch(host, []string{
		`PUT /acct/Hot(PartitionKey='p',RowKey='s') {"N":-1}`,
		`PUT /acct/Hot(PartitionKey='p',RowKey='gone') {"N":1}`,
	})
	st, h, b = a.do("POST", "/$batch", map[string]string{"Content-Type": ct}, body)
	if st != 202 || !strings.Contains(string(b), "404") || !strings.Contains(string(b), "ResourceNotFound") {
		t.Fatalf("batch update * of a missing entity: %d %s", st, b)
	}
	_, _, b = a.do("GET", "/Hot(PartitionKey='p',RowKey='s')", nil, nil)
	if strings.Contains(string(b), `"N":-1`) {
		t.Fatalf("the failed batch applied its first operation: %s", b)
	}
	// An ETag that no longer holds is still 412.
	st, h, b = a.do("PUT", "/Hot(PartitionKey='p',RowKey='r')", map[string]string{"If-Match": `W/"datetime'2000-01-01T00%3A00%3A00.0000000Z'"`}, map[string]any{"N": 1})
	a.want("update with a stale ETag", 412, "UpdateConditionNotSatisfied", st, h, b)
	// Concurrent deletes with *: one deletes, the others find nothing.
	var deleted, missing, other int
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, h, _ := a.do("DELETE", "/Hot(PartitionKey='p',RowKey='r')", star, nil)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case st == 204:
				deleted++
			case st == 404 && h.Get("x-ms-error-code") == "ResourceNotFound":
				missing++
			default:
				other++
			}
		}()
	}
	wg.Wait()
	if deleted != 1 || missing != 7 || other != 0 {
		t.Fatalf("8 concurrent deletes with *: %d deleted, %d not found, %d other; want 1, 7, 0", deleted, missing, other)
	}
}
