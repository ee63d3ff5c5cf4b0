// Package faultproxy is a TCP proxy that injects network faults, for tests
// that run real processes: a Proxy listens on 127.0.0.1, forwards every
// connection to one target address, and can be switched at any time between
//
//	Pass       forward both ways (the default, and what Heal returns to)
//	Blackhole  accept connections but move no byte either way and read
//	           nothing: callers hang as on a cut link until their own
//	           deadline; bytes already read are held, not dropped, and flow
//	           again after Heal (as TCP retransmits after a partition heals)
//	Reset      reset every open connection (RST, not FIN) and every new one
//	           at once: a crashed or unreachable peer
//	Delay(d)   forward, each chunk no earlier than d after it was read: d of
//	           one-way latency in each direction, throughput unchanged
//
// One Proxy is one destination: put one in front of each process and
// advertise the proxy's address, so everything that reaches that process
// (clients, the master, other servers) crosses it. For a cut between two
// particular processes, give the dialling side its own Proxy to the target.
//
//	p, err := faultproxy.New("127.0.0.1:7201")
//	if err != nil { ... }
//	defer p.Close()
//	start the server with --advertise p.Addr()
//	p.Blackhole()  // the server is cut off
//	p.Heal()
//
// A connection whose target cannot be dialled is reset, so a dead target
// looks refused from the caller's side, as without the proxy.
//
// # Concurrency
//
// A Proxy is safe for concurrent use. It owns an accept goroutine and two
// goroutines per direction of each connection; Close stops all of them,
// closes every connection and waits. Close is idempotent.
package faultproxy
