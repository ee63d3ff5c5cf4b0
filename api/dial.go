package api

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// ReconnectBackoff caps how long a connection waits between attempts to
// reach a peer that went away. gRPC's default grows to 120 s, so a client
// or server could lag a restarted peer by tens of seconds; a failover or a
// restart is meant to be followed within a second.
var ReconnectBackoff = backoff.Config{
	BaseDelay:  50 * time.Millisecond,
	Multiplier: 1.6,
	Jitter:     0.2,
	MaxDelay:   time.Second,
}

// FastReconnect is the dial option every Tabula client and server uses to
// reach its peers (see ReconnectBackoff).
func FastReconnect() grpc.DialOption {
	return grpc.WithConnectParams(grpc.ConnectParams{Backoff: ReconnectBackoff, MinConnectTimeout: time.Second})
}
