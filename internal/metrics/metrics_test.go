package metrics

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream/streampb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestTenantTable(t *testing.T) {
	hdr := &api.RequestHeader{Tenant: "acme", Table: "users"}
	for _, tc := range []struct {
		name          string
		req           any
		tenant, table string
	}{
		{"header", &api.PutRequest{Header: hdr}, "acme", "users"},
		{"no header", &api.PutRequest{}, "", ""},
		{"top level", &api.GetPartitionMapRequest{Tenant: "acme", Table: "users"}, "acme", "users"},
		{"name is the table", &api.CreateTableRequest{Tenant: "acme", Name: "users"}, "acme", "users"},
		{"tenant only", &api.ListTablesRequest{Tenant: "acme"}, "acme", ""},
		{"no tenant", &api.HeartbeatRequest{ServerId: "s1"}, "", ""},
		{"not a message", "hello", "", ""},
		{"nil message", (*api.PutRequest)(nil), "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tenant, table := tenantTable(tc.req)
			if tenant != tc.tenant || table != tc.table {
				t.Fatalf("tenantTable = (%q, %q), want (%q, %q)", tenant, table, tc.tenant, tc.table)
			}
		})
	}
}

func TestOpOf(t *testing.T) {
	for in, want := range map[string]string{
		"/tabula.v1.TableServer/Put":        "TableServer/Put",
		"/tabula.stream.v1.ExtentNode/Read": "ExtentNode/Read",
		"/Svc/M":                            "Svc/M",
		"odd":                               "odd",
	} {
		if got := opOf(in); got != want {
			t.Errorf("opOf(%q) = %q, want %q", in, got, want)
		}
	}
}

// call runs one unary RPC of method through r's interceptor.
func call(r *Registry, method string, req any, err error) {
	ic := r.UnaryServerInterceptor()
	_, _ = ic(context.Background(), req, &grpc.UnaryServerInfo{FullMethod: method}, func(context.Context, any) (any, error) {
		return nil, err
	})
}

func TestCardinalityCap(t *testing.T) {
	r := New(Options{MaxTablePairs: 3, NoRuntime: true})
	const put = "/tabula.v1.TableServer/Put"
	for i := range 5 {
		call(r, put, putReq(fmt.Sprintf("t%d", i), "tbl"), nil)
	}
	// A pair already admitted keeps its labels after the cap is reached.
	call(r, put, putReq("t0", "tbl"), nil)
	// Names that are not names never become labels, and take no slot.
	call(r, put, putReq("bad name!", strings.Repeat("x", 500)), nil)

	if got := testutil.ToFloat64(r.requests.WithLabelValues("t0", "tbl", "TableServer/Put")); got != 2 {
		t.Errorf("t0 requests = %v, want 2", got)
	}
	for _, tn := range []string{"t1", "t2"} {
		if got := testutil.ToFloat64(r.requests.WithLabelValues(tn, "tbl", "TableServer/Put")); got != 1 {
			t.Errorf("%s requests = %v, want 1", tn, got)
		}
	}
	// t3, t4 and the invalid pair arrived after the cap: 3 pairs are taken.
	if got := testutil.ToFloat64(r.requests.WithLabelValues(Other, Other, "TableServer/Put")); got != 3 {
		t.Errorf("_other requests = %v, want 3", got)
	}
	if got := testutil.ToFloat64(r.overflow); got != 3 {
		t.Errorf("overflow = %v, want 3", got)
	}
	if got := r.labels.size(); got != 3 {
		t.Errorf("pairs = %d, want 3", got)
	}
	// Series: 3 admitted pairs + _other, and nothing with t3 or t4.
	if n := testutil.CollectAndCount(r.requests); n != 4 {
		t.Errorf("request series = %d, want 4", n)
	}
	if err := testutil.GatherAndCompare(r.Gatherer(), strings.NewReader(`
# HELP tabula_rpc_label_pairs Distinct (tenant, table) pairs with their own RPC series (at most the cap).
# TYPE tabula_rpc_label_pairs gauge
tabula_rpc_label_pairs 3
`), "tabula_rpc_label_pairs"); err != nil {
		t.Error(err)
	}
}

func putReq(tenant, table string) *api.PutRequest {
	return &api.PutRequest{Header: &api.RequestHeader{Tenant: tenant, Table: table}}
}

func TestInvalidNamesAreNotLabels(t *testing.T) {
	r := New(Options{NoRuntime: true})
	call(r, "/tabula.v1.TableServer/Put", putReq("ok", "9starts-with-digit"), nil)
	if got := testutil.ToFloat64(r.requests.WithLabelValues("ok", Invalid, "TableServer/Put")); got != 1 {
		t.Fatalf("requests{table=_invalid} = %v, want 1", got)
	}
}

func TestErrorsByCode(t *testing.T) {
	r := New(Options{NoRuntime: true})
	busy := api.Errorf(api.ErrorCode_ERROR_CODE_SERVER_BUSY, "busy", "too many requests")
	call(r, "/tabula.v1.TableServer/Get", &api.GetRequest{Header: &api.RequestHeader{Tenant: "a", Table: "b"}}, busy)
	call(r, "/tabula.v1.TableServer/Get", &api.GetRequest{Header: &api.RequestHeader{Tenant: "a", Table: "b"}}, nil)
	call(r, "/tabula.v1.TableServer/Get", &api.GetRequest{Header: &api.RequestHeader{Tenant: "a", Table: "b"}}, context.Canceled)
	want := fmt.Sprintf(`
# HELP tabula_rpc_errors_total RPCs answered with an error, by tenant, table, operation, gRPC code and Tabula error code.
# TYPE tabula_rpc_errors_total counter
tabula_rpc_errors_total{code="%s",error="SERVER_BUSY",op="TableServer/Get",table="b",tenant="a"} 1
tabula_rpc_errors_total{code="Canceled",error="",op="TableServer/Get",table="b",tenant="a"} 1
`, status.Code(busy))
	if err := testutil.GatherAndCompare(r.Gatherer(), strings.NewReader(want), "tabula_rpc_errors_total"); err != nil {
		t.Error(err)
	}
	if got := testutil.ToFloat64(r.requests.WithLabelValues("a", "b", "TableServer/Get")); got != 3 {
		t.Errorf("requests = %v, want 3", got)
	}
	if n := testutil.CollectAndCount(r.latency); n != 1 {
		t.Errorf("latency series = %d, want 1", n)
	}
}

// fakeStream is the server side of a stream whose client sent msgs.
type fakeStream struct {
	grpc.ServerStream
	msgs []proto.Message
	ctx  context.Context // nil: never done
}

func (s *fakeStream) Context() context.Context {
	if s.ctx == nil {
		return context.Background()
	}
	return s.ctx
}
func (s *fakeStream) SetHeader(metadata.MD) error  { return nil }
func (s *fakeStream) SendHeader(metadata.MD) error { return nil }
func (s *fakeStream) SetTrailer(metadata.MD)       {}
func (s *fakeStream) SendMsg(any) error            { return nil }
func (s *fakeStream) RecvMsg(m any) error {
	if len(s.msgs) == 0 {
		return io.EOF
	}
	proto.Merge(m.(proto.Message), s.msgs[0])
	s.msgs = s.msgs[1:]
	return nil
}

func TestStreamLabelledByFirstMessage(t *testing.T) {
	r := New(Options{NoRuntime: true})
	ss := &fakeStream{msgs: []proto.Message{
		&api.BulkUploadRequest{Header: &api.RequestHeader{Tenant: "acme", Table: "files"}},
		&api.BulkUploadRequest{Header: &api.RequestHeader{Tenant: "other", Table: "x"}},
	}}
	err := r.StreamServerInterceptor()(nil, ss, &grpc.StreamServerInfo{FullMethod: "/tabula.v1.TableServer/BulkUpload", IsClientStream: true},
		func(_ any, s grpc.ServerStream) error {
			for {
				var m api.BulkUploadRequest
				if err := s.RecvMsg(&m); err != nil {
					return nil
				}
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(r.requests.WithLabelValues("acme", "files", "TableServer/BulkUpload")); got != 1 {
		t.Fatalf("requests = %v, want 1", got)
	}
	if n := testutil.CollectAndCount(r.requests); n != 1 {
		t.Fatalf("request series = %d, want 1", n)
	}
}

// TestStreamEndedByClientIsNoError: a stream the client cancelled (a
// watch it was done with) is a request, not an error; a stream that fails
// while its client waits is both.
func TestStreamEndedByClientIsNoError(t *testing.T) {
	r := New(Options{NoRuntime: true})
	info := &grpc.StreamServerInfo{FullMethod: "/tabula.v1.Master/WatchPartitionMap", IsServerStream: true}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for _, ss := range []*fakeStream{{ctx: gone}, {}} {
		err := r.StreamServerInterceptor()(nil, ss, info, func(_ any, s grpc.ServerStream) error {
			if err := s.Context().Err(); err != nil {
				return status.FromContextError(err).Err()
			}
			return status.Error(codes.Unavailable, "master stepped down")
		})
		if err == nil {
			t.Fatal("the handler's error was not returned")
		}
	}
	if got := testutil.ToFloat64(r.requests.WithLabelValues("", "", "Master/WatchPartitionMap")); got != 2 {
		t.Errorf("requests = %v, want 2", got)
	}
	if n := testutil.CollectAndCount(r.errs); n != 1 {
		t.Errorf("error series = %d, want 1 (the Unavailable one)", n)
	}
	if got := testutil.ToFloat64(r.errs.WithLabelValues("", "", "Master/WatchPartitionMap", "Unavailable", errorLabel(status.Error(codes.Unavailable, "")))); got != 1 {
		t.Errorf("Unavailable errors = %v, want 1", got)
	}
}

// TestReplicateStreamRecordsBatches: each batch of a ReplicateStream is
// recorded as the ReplicateBatch call it stands for (answers in any
// order; the end-of-stream request, id 0, is none), and the stream itself
// is not.
func TestReplicateStreamRecordsBatches(t *testing.T) {
	r := New(Options{NoRuntime: true})
	ss := &fakeStream{msgs: []proto.Message{
		&streampb.ReplicateBatchRequest{Id: 1},
		&streampb.ReplicateBatchRequest{Id: 2},
		&streampb.ReplicateBatchRequest{Id: 3},
	}}
	err := r.StreamServerInterceptor()(nil, ss, &grpc.StreamServerInfo{FullMethod: streampb.ExtentNode_ReplicateStream_FullMethodName, IsClientStream: true, IsServerStream: true},
		func(_ any, s grpc.ServerStream) error {
			for range 3 {
				if err := s.RecvMsg(&streampb.ReplicateBatchRequest{}); err != nil {
					return err
				}
			}
			for _, id := range []uint64{2, 0, 1} { // 3 is never answered
				if err := s.SendMsg(&streampb.ReplicateBatchResponse{Id: id}); err != nil {
					return err
				}
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(r.requests.WithLabelValues("", "", "ExtentNode/ReplicateBatch")); got != 2 {
		t.Fatalf("ReplicateBatch requests = %v, want 2", got)
	}
	if n := testutil.CollectAndCount(r.requests); n != 1 {
		t.Fatalf("request series = %d, want 1 (none for the stream)", n)
	}
}

func TestServeOverHTTP(t *testing.T) {
	r := New(Options{})
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "tabula_test_things_total", Help: "Things."})
	c.Add(7)
	r.Registerer().MustRegister(c)
	call(r, "/tabula.v1.TableServer/Put", putReq("acme", "users"), nil)
	s, err := r.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	resp, err := http.Get(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"tabula_test_things_total 7",
		`tabula_rpc_requests_total{op="TableServer/Put",table="users",tenant="acme"} 1`,
		"go_goroutines",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestNewCollector(t *testing.T) {
	reads := Counter("tabula_test_reads_total", "Reads.", "kind")
	size := Gauge("tabula_test_size_bytes", "Size.")
	n := 0
	c := NewCollector(func(emit func(prometheus.Metric)) {
		n++
		emit(reads.Metric(float64(10*n), "point"))
		emit(size.Metric(42))
	}, reads, size)
	r := New(Options{NoRuntime: true})
	r.Registerer().MustRegister(c)
	if err := testutil.GatherAndCompare(r.Gatherer(), strings.NewReader(`
# HELP tabula_test_reads_total Reads.
# TYPE tabula_test_reads_total counter
tabula_test_reads_total{kind="point"} 10
# HELP tabula_test_size_bytes Size.
# TYPE tabula_test_size_bytes gauge
tabula_test_size_bytes 42
`), "tabula_test_reads_total", "tabula_test_size_bytes"); err != nil {
		t.Fatal(err)
	}
}

func BenchmarkUnaryInterceptor(b *testing.B) {
	r := New(Options{NoRuntime: true})
	ic := r.UnaryServerInterceptor()
	req := putReq("acme", "users")
	info := &grpc.UnaryServerInfo{FullMethod: "/tabula.v1.TableServer/Put"}
	h := func(context.Context, any) (any, error) { return nil, nil }
	b.ReportAllocs()
	for b.Loop() {
		_, _ = ic(context.Background(), req, info, h)
	}
}
