package stream

import (
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream/streampb"
)

// MaxMessageBytes is the gRPC message limit the stream layer's clients and
// servers need: an append of MaxAppendBytes with its block headers and
// framing. Servers hosting an extent node pass ServerOptions.
const MaxMessageBytes = MaxAppendBytes + 4<<20

// ServerOptions are the grpc.ServerOptions an extent node's server needs
// (message size limits).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes), api.ServerKeepalive()}
}

// Conns caches one gRPC connection per extent node address. It is safe for
// concurrent use; Close closes every connection.
type Conns struct {
	opts []grpc.DialOption

	mu sync.Mutex
	// Guarded by mu.
	conns  map[string]*grpc.ClientConn
	closed bool
}

// NewConns returns an empty cache. opts are added to the defaults
// (insecure transport credentials, the stream layer's message limits).
func NewConns(opts ...grpc.DialOption) *Conns {
	def := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		api.FastReconnect(), api.Keepalive(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)),
	}
	return &Conns{opts: append(def, opts...), conns: map[string]*grpc.ClientConn{}}
}

// Node returns a client of the extent node at addr.
func (c *Conns) Node(addr string) (streampb.ExtentNodeClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	cc := c.conns[addr]
	if cc == nil {
		var err error
		// grpc.NewClient does no I/O: it connects on the first call.
		if cc, err = grpc.NewClient(addr, c.opts...); err != nil {
			return nil, fmt.Errorf("stream: dial %s: %w", addr, err)
		}
		c.conns[addr] = cc
	}
	return streampb.NewExtentNodeClient(cc), nil
}

// Close closes every connection. Idempotent.
func (c *Conns) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var err error
	for _, cc := range c.conns {
		err = errors.Join(err, cc.Close())
	}
	c.conns = nil
	return err
}
