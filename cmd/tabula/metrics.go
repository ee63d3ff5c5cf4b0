package main

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tabuladb/tabula/internal/metrics"
	"github.com/tabuladb/tabula/tablemaster"
	"github.com/tabuladb/tabula/tableserver"
)

// metricsListenUsage is the help of every --metrics-listen flag.
const metricsListenUsage = "address serving Prometheus metrics on /metrics, e.g. 127.0.0.1:9100 (default: none)"

// processMetrics is this process's metrics registry and its HTTP server,
// both nil when --metrics-listen is empty.
type processMetrics struct {
	reg *metrics.Registry
	srv *metrics.Server
}

// startMetrics makes the process's Registry and serves it on addr; an
// empty addr turns metrics off.
func startMetrics(addr string, log *slog.Logger) (*processMetrics, error) {
	if addr == "" {
		return &processMetrics{}, nil
	}
	reg := metrics.New(metrics.Options{})
	srv, err := reg.Listen(addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen: %w", err)
	}
	log.Info("serving metrics", "url", srv.URL())
	return &processMetrics{reg: reg, srv: srv}, nil
}

// URL is the metrics page's address ("" when off).
func (p *processMetrics) URL() string {
	if p.srv == nil {
		return ""
	}
	return p.srv.URL()
}

// Close stops the metrics server.
func (p *processMetrics) Close() error {
	if p.srv == nil {
		return nil
	}
	return p.srv.Close()
}

// master wires the registry into a master's options; labels (may be nil)
// tell several masters of one process apart.
func (p *processMetrics) master(o *tablemaster.Options, labels prometheus.Labels) {
	if p.reg == nil {
		return
	}
	o.Metrics = prometheus.WrapRegistererWith(labels, p.reg.Registerer())
	o.UnaryInterceptors = append(o.UnaryInterceptors, p.reg.UnaryServerInterceptor())
	o.StreamInterceptors = append(o.StreamInterceptors, p.reg.StreamServerInterceptor())
}

// server wires the registry into a table server's options, as master.
func (p *processMetrics) server(o *tableserver.Options, labels prometheus.Labels) {
	if p.reg == nil {
		return
	}
	o.Metrics = prometheus.WrapRegistererWith(labels, p.reg.Registerer())
	o.UnaryInterceptors = append(o.UnaryInterceptors, p.reg.UnaryServerInterceptor())
	o.StreamInterceptors = append(o.StreamInterceptors, p.reg.StreamServerInterceptor())
}
