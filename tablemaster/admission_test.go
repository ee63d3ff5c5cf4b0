package tablemaster

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// TestMasterAdmission: past its cap of client calls the master answers
// SERVER_BUSY with a retry_after (the handler does not run), while the
// servers' calls, which have their own cap, still pass; the SDK backs off
// and succeeds once a slot frees. Map watches have a cap of their own.
func TestMasterAdmission(t *testing.T) {
	r := start(t, Options{DataDir: t.TempDir(), MaxRequests: 2, MaxWatches: 1, BusyRetryAfter: 20 * time.Millisecond})
	defer r.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	// Two client calls in flight (held as a handler would hold them).
	var held []func()
	for range 2 {
		release, err := r.m.adm.admit("/tabula.v1.Master/CreateTable")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, release)
	}
	_, err := r.c.CreateTable(ctx, &api.CreateTableRequest{Tenant: "default", Name: "t1", Kind: api.TableKind_TABLE_KIND_POINT})
	d := api.DetailOf(err)
	if d.GetCode() != api.ErrorCode_ERROR_CODE_SERVER_BUSY || d.GetReason() != "master_busy" || d.GetRetryAfterMs() != 20 {
		t.Fatalf("create past the cap: %v", err)
	}
	if !strings.Contains(err.Error(), "2 client requests in flight") {
		t.Fatalf("the refusal does not name the cap: %v", err)
	}
	if len(r.m.State().Tables) != 0 {
		t.Fatalf("a refused create made a table: %v", r.m.State().Tables)
	}
	// A server's call is another class.
	if _, err := r.c.RegisterServer(ctx, &api.RegisterServerRequest{Addr: "127.0.0.1:1", Incarnation: 1}); err != nil {
		t.Fatalf("register while clients are refused: %v", err)
	}
	if st := r.m.AdmissionStats(); st.Refused["client"] != 1 || st.InFlight["client"] != 2 || st.Refused["internal"] != 0 {
		t.Fatalf("stats %+v", st)
	}

	// The SDK retries SERVER_BUSY after the retry_after: it succeeds once
	// a slot is free.
	c, err := client.New(ctx, client.Options{Masters: []string{r.conn.Target()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		_, err := c.ListTables(ctx)
		done <- err
	}()
	for r.m.AdmissionStats().Refused["client"] < 2 {
		select {
		case err := <-done:
			t.Fatalf("list finished while the master was full: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	held[0]()
	if err := <-done; err != nil {
		t.Fatalf("list after a slot freed: %v", err)
	}
	held[1]()

	// Watches: one open, the next refused.
	wctx, wcancel := context.WithCancel(ctx)
	w, err := r.c.WatchPartitionMap(wctx, &api.WatchPartitionMapRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	w2, err := r.c.WatchPartitionMap(ctx, &api.WatchPartitionMapRequest{})
	if err == nil {
		_, err = w2.Recv()
	}
	if api.DetailOf(err).GetCode() != api.ErrorCode_ERROR_CODE_SERVER_BUSY {
		t.Fatalf("second watch: %v", err)
	}
	wcancel()
}

// TestMasterRefusesOversizedRequest: a catalog call is held to its own
// size limit before it is decoded, far below the server-wide one, and
// changes nothing.
func TestMasterRefusesOversizedRequest(t *testing.T) {
	r := start(t, Options{DataDir: t.TempDir()})
	defer r.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := r.c.CreateTable(ctx, &api.CreateTableRequest{Tenant: "default", Name: "t1", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Compression: strings.Repeat("x", 200<<10)}})
	if d := api.DetailOf(err); d.GetReason() != "message_too_large" || d.GetLimit() != api.SmallRequestBytes {
		t.Fatalf("oversized create: %v", err)
	}
	if len(r.m.State().Tables) != 0 {
		t.Fatal("an oversized create made a table")
	}
	if r.m.AdmissionStats().RefusedBySize != 1 {
		t.Fatalf("stats %+v", r.m.AdmissionStats())
	}
}
