package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Mode is what a Proxy does with the traffic it carries.
type Mode int

const (
	// Pass forwards both ways (after the Delay set, if any).
	Pass Mode = iota
	// Blackhole accepts connections but reads and forwards nothing.
	Blackhole
	// Reset resets every connection, open and new.
	Reset
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Blackhole:
		return "blackhole"
	case Reset:
		return "reset"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// dialTimeout bounds the dial of the target for each accepted connection:
// loopback either answers at once or the target is gone.
const dialTimeout = 2 * time.Second

// chunkSize is the most one read takes from a connection.
const chunkSize = 32 << 10

// Proxy forwards connections from its listening address to one target,
// injecting the fault its mode says. Safe for concurrent use; Close stops
// every goroutine and connection it owns.
type Proxy struct {
	target string
	lis    net.Listener
	ctx    context.Context // cancelled by Close; bounds dials
	cancel context.CancelFunc
	wg     sync.WaitGroup // accept loop and connection goroutines

	mu sync.Mutex // guards the fields below
	// mode and delay are the fault in force; changed is closed (and
	// replaced) whenever either changes, waking goroutines that wait on them.
	mode    Mode
	delay   time.Duration
	changed chan struct{}
	links   map[*link]struct{}
	closed  bool
}

// New listens on 127.0.0.1 at a free port and forwards every connection to
// target, in Pass mode.
func New(target string) (*Proxy, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{target: target, lis: lis, changed: make(chan struct{}), links: make(map[*link]struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the address the proxy listens on (host:port).
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Mode returns the mode in force and the delay set.
func (p *Proxy) Mode() (Mode, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode, p.delay
}

// Heal returns to Pass with no delay; held bytes flow again.
func (p *Proxy) Heal() { p.set(Pass, 0) }

// Blackhole stops all traffic; connections stay open and hang.
func (p *Proxy) Blackhole() { p.set(Blackhole, -1) }

// Reset resets every open connection and every new one until the mode
// changes.
func (p *Proxy) Reset() { p.set(Reset, -1) }

// Delay forwards again, each chunk d after it was read (d ≤ 0: no delay).
func (p *Proxy) Delay(d time.Duration) { p.set(Pass, max(d, 0)) }

// set changes the mode (and the delay, unless delay < 0) and wakes every
// waiting goroutine; Reset also resets the open connections.
func (p *Proxy) set(m Mode, delay time.Duration) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.mode = m
	if delay >= 0 {
		p.delay = delay
	}
	close(p.changed)
	p.changed = make(chan struct{})
	var cut []*link
	if m == Reset {
		for l := range p.links {
			cut = append(cut, l)
		}
	}
	p.mu.Unlock()
	for _, l := range cut {
		l.close(true)
	}
}

// state returns the fault in force and a channel closed at its next change.
func (p *Proxy) state() (Mode, time.Duration, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode, p.delay, p.changed
}

// Close stops accepting, closes every connection and waits for every
// goroutine. Idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	links := p.links
	p.links = nil
	p.mu.Unlock()
	p.cancel()
	err := p.lis.Close()
	for l := range links {
		l.close(false)
	}
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			// The listener is closed (Close) or broken; either way no
			// more connections come.
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve dials the target for one accepted connection and pumps both ways.
func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	if m, _, _ := p.state(); m == Reset {
		resetConn(c)
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, dialTimeout)
	var d net.Dialer
	s, err := d.DialContext(ctx, "tcp", p.target)
	cancel()
	if err != nil {
		resetConn(c)
		return
	}
	l := &link{client: c, server: s, done: make(chan struct{})}
	if !p.add(l) {
		l.close(true)
		return
	}
	defer p.remove(l)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pump(l, c, s) }()
	go func() { defer wg.Done(); p.pump(l, s, c) }()
	wg.Wait()
	l.close(false)
}

// add registers l unless the proxy is closed or resetting.
func (p *Proxy) add(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.mode == Reset {
		return false
	}
	p.links[l] = struct{}{}
	return true
}

func (p *Proxy) remove(l *link) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.links, l)
}

// chunk is bytes read from one side, stamped with when they were read.
type chunk struct {
	b  []byte
	at time.Time
}

// pump moves src's bytes to dst: a reader that stops reading while the
// proxy is a blackhole, and a writer that holds each chunk while it is one
// and until its delay has passed. At src's EOF it half-closes dst once
// everything read is written; any other failure ends the whole link.
func (p *Proxy) pump(l *link, src, dst net.Conn) {
	ch := make(chan chunk, 16)
	go func() {
		defer close(ch)
		for {
			if !p.waitFlowing(l) {
				return
			}
			buf := make([]byte, chunkSize)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case ch <- chunk{b: buf[:n], at: time.Now()}:
				case <-l.done:
					return
				}
			}
			if err != nil {
				if !isEOF(err) {
					l.close(true)
				}
				return
			}
		}
	}()
	for c := range ch {
		if !p.waitDue(l, c.at) {
			break
		}
		if _, err := dst.Write(c.b); err != nil {
			l.close(true)
			break
		}
	}
	// Drain so the reader never blocks on a full channel after we stop.
	for range ch {
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// waitFlowing waits while the proxy is a blackhole; false once l is closed.
func (p *Proxy) waitFlowing(l *link) bool {
	for {
		m, _, changed := p.state()
		if m != Blackhole {
			return !l.isClosed()
		}
		select {
		case <-changed:
		case <-l.done:
			return false
		}
	}
}

// waitDue waits until a chunk read at may be written: not while the proxy
// is a blackhole, and not before at plus the delay in force. False once l
// is closed.
func (p *Proxy) waitDue(l *link, at time.Time) bool {
	for {
		m, delay, changed := p.state()
		if m == Blackhole {
			select {
			case <-changed:
				continue
			case <-l.done:
				return false
			}
		}
		wait := time.Until(at.Add(delay))
		if wait <= 0 {
			return !l.isClosed()
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-changed:
		case <-l.done:
			t.Stop()
			return false
		}
		t.Stop()
	}
}

// link is one proxied connection: the accepted side and the dialled one.
type link struct {
	client, server net.Conn
	once           sync.Once
	done           chan struct{} // closed by close
}

// close closes both sides once; reset sends RST instead of FIN.
func (l *link) close(reset bool) {
	l.once.Do(func() {
		close(l.done)
		if reset {
			resetConn(l.client)
			resetConn(l.server)
			return
		}
		_ = l.client.Close()
		_ = l.server.Close()
	})
}

func (l *link) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// resetConn closes c with an RST: linger 0 discards unsent data.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }
