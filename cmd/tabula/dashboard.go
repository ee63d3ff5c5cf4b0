package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/tabuladb/tabula/internal/testcluster"
)

// dashboardListenUsage is the help of every --dashboard-listen flag.
const dashboardListenUsage = "address serving the operator dashboard (a web page), e.g. 127.0.0.1:8080. " +
	"It has NO authentication and shows the whole cluster: bind it to loopback or put it behind an authenticating proxy"

// dashboardServer serves the master's dashboard over HTTP; nil-safe when
// off. Close stops it.
type dashboardServer struct {
	lis       net.Listener
	srv       *http.Server
	done      chan struct{}
	err       error // set before done is closed
	closeOnce sync.Once
	closeErr  error
}

// startDashboard serves h on addr; an empty addr turns it off (nil).
func startDashboard(addr string, h http.Handler, log *slog.Logger) (*dashboardServer, error) {
	if addr == "" {
		return nil, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--dashboard-listen: %w", err)
	}
	d := &dashboardServer{lis: lis, srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		if err := d.srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			d.err = err
		}
	}()
	log.Info("serving the dashboard (no authentication)", "url", d.URL())
	return d, nil
}

// URL is the dashboard's address ("" when off).
func (d *dashboardServer) URL() string {
	if d == nil {
		return ""
	}
	return "http://" + d.lis.Addr().String() + "/"
}

// Close stops the server and waits for it. It is idempotent.
func (d *dashboardServer) Close() error {
	if d == nil {
		return nil
	}
	d.closeOnce.Do(func() {
		err := d.srv.Close()
		<-d.done
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		d.closeErr = errors.Join(err, d.err)
	})
	return d.closeErr
}

// devDashboard is the dashboard of a dev cluster: the leading master's
// (with a raft group every member runs in this process, so the page
// follows the leader; with none leading, member 1's, which says so).
func devDashboard(c *testcluster.Cluster) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m := c.Master(max(c.Leader(), 0))
		for i := 0; m == nil && i < c.Masters(); i++ {
			m = c.Master(i)
		}
		if m == nil {
			http.Error(w, "no master is running", http.StatusServiceUnavailable)
			return
		}
		m.DashboardHandler().ServeHTTP(w, r)
	})
}
