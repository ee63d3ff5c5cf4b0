package api

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/keepalive"
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
// reach its peers (see ReconnectBackoff), with Keepalive.
func FastReconnect() grpc.DialOption {
	return grpc.WithConnectParams(grpc.ConnectParams{Backoff: ReconnectBackoff, MinConnectTimeout: time.Second})
}

// KeepaliveTime and KeepaliveTimeout: see Keepalive.
const (
	KeepaliveTime    = 2 * time.Second
	KeepaliveTimeout = 2 * time.Second
)

// Keepalive is the dial option that pings a peer with calls in flight (a
// map watch, a long call) every KeepaliveTime and drops the connection
// when a ping goes unanswered for KeepaliveTimeout: a stopped process
// (SIGSTOP, a hung host) keeps its TCP connections open, and a watch on it
// would otherwise wait forever instead of moving to another master. Every
// Tabula client and server dials with it and FastReconnect.
func Keepalive() grpc.DialOption {
	return grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: KeepaliveTime, Timeout: KeepaliveTimeout})
}

// ServerKeepalive is the server option that lets peers ping as Keepalive
// does (gRPC's default refuses pings more often than every 5 minutes and
// closes the connection).
func ServerKeepalive() grpc.ServerOption {
	return grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveTime / 2, PermitWithoutStream: true})
}
