package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
)

// serveDebug serves Go's profiling endpoints (/debug/pprof/...) on addr,
// for operators chasing CPU or memory; "" serves nothing. The listener is
// separate from the gRPC one so it can stay on loopback. It returns once
// listening; the server runs until the process exits.
func serveDebug(addr string, log *slog.Logger) error {
	if addr == "" {
		return nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("debug listener on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	log.Info("debug endpoints listening", "addr", lis.Addr().String())
	go func() {
		if err := http.Serve(lis, mux); err != nil && !errors.Is(err, net.ErrClosed) {
			log.Error("debug listener", "err", err)
		}
	}()
	return nil
}
