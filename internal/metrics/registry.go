package metrics

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultMaxTablePairs is Options.MaxTablePairs's default.
const DefaultMaxTablePairs = 1000

// Label values that stand for many or for bad names; a real tenant or table
// name starts with a letter, so neither is ever a real one.
const (
	// Other labels the (tenant, table) pairs beyond Options.MaxTablePairs.
	Other = "_other"
	// Invalid labels a tenant or table that is not a valid name.
	Invalid = "_invalid"
)

// Options configure a Registry. The zero value works.
type Options struct {
	// MaxTablePairs is how many distinct (tenant, table) pairs get their
	// own RPC series; later pairs are labelled Other. Default
	// DefaultMaxTablePairs.
	MaxTablePairs int
	// NoRuntime leaves out the Go runtime and process collectors (go_*,
	// process_*), which a Registry includes by default.
	NoRuntime bool
}

// Validate says what is wrong with o, if anything.
func (o Options) Validate() error {
	if o.MaxTablePairs < 0 {
		return fmt.Errorf("metrics: MaxTablePairs %d is negative", o.MaxTablePairs)
	}
	return nil
}

// Registry is one process's metrics: its own prometheus.Registry, the RPC
// metrics its interceptors record, and the collectors components register
// with it. Safe for concurrent use.
type Registry struct {
	reg    *prometheus.Registry
	labels *labeler

	requests *prometheus.CounterVec
	errs     *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	overflow prometheus.Counter
	// series caches the children of requests and latency (interceptor.go):
	// seriesKey to *series.
	series sync.Map
}

// latencyBuckets span a cached read (~100 µs) to a coprocessor call at the
// server's deadline cap (30 s).
var latencyBuckets = []float64{
	.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30,
}

// New returns a Registry with the RPC metrics (and, unless
// Options.NoRuntime, the Go runtime and process collectors) registered. It
// panics if opts does not validate.
func New(opts Options) *Registry {
	if err := opts.Validate(); err != nil {
		panic(err)
	}
	if opts.MaxTablePairs == 0 {
		opts.MaxTablePairs = DefaultMaxTablePairs
	}
	r := &Registry{
		reg:    prometheus.NewRegistry(),
		labels: newLabeler(opts.MaxTablePairs),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabula_rpc_requests_total",
			Help: "RPCs answered, by tenant, table and operation.",
		}, []string{"tenant", "table", "op"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabula_rpc_errors_total",
			Help: "RPCs answered with an error, by tenant, table, operation, gRPC code and Tabula error code.",
		}, []string{"tenant", "table", "op", "code", "error"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tabula_rpc_latency_seconds",
			Help:    "Time from an RPC's arrival to its answer (a stream's whole life), by tenant, table and operation.",
			Buckets: latencyBuckets,
		}, []string{"tenant", "table", "op"}),
		overflow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tabula_rpc_label_overflow_total",
			Help: "RPCs labelled tenant and table \"_other\": their pair came after the per-process cap of distinct pairs.",
		}),
	}
	pairs := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tabula_rpc_label_pairs",
		Help: "Distinct (tenant, table) pairs with their own RPC series (at most the cap).",
	}, func() float64 { return float64(r.labels.size()) })
	r.reg.MustRegister(r.requests, r.errs, r.latency, r.overflow, pairs)
	if !opts.NoRuntime {
		r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return r
}

// Registerer is where components register their collectors. Wrap it with
// prometheus.WrapRegistererWith to tell several instances of one component
// apart in one process (tabula dev's servers).
func (r *Registry) Registerer() prometheus.Registerer { return r.reg }

// Gatherer gathers every registered metric, for tests and custom exports.
func (r *Registry) Gatherer() prometheus.Gatherer { return r.reg }

// Handler serves the registry in the Prometheus text (or, if asked,
// protobuf) exposition format.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg, ErrorHandling: promhttp.ContinueOnError})
}

// Server serves a Registry's Handler on /metrics over HTTP. Safe for
// concurrent use; Close stops it.
type Server struct {
	lis  net.Listener
	srv  *http.Server
	done chan struct{}
	err  error // Serve's error; read after done

	closeOnce sync.Once
	closeErr  error
}

// Listen listens on addr ("127.0.0.1:9100"; port 0 picks a free one) and
// serves the registry on /metrics until Close.
func (r *Registry) Listen(addr string) (*Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", r.Handler())
	s := &Server{
		lis:  lis,
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			s.err = err
		}
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// URL is the address of the metrics page.
func (s *Server) URL() string { return "http://" + s.Addr() + "/metrics" }

// Close stops the server (a scrape in progress is cut off) and waits for
// its goroutine. It is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		err := s.srv.Close()
		<-s.done
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.closeErr = errors.Join(err, s.err)
	})
	return s.closeErr
}
