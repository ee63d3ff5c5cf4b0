package faultproxy

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer accepts connections and echoes what it reads until closed.
type echoServer struct {
	lis net.Listener
	wg  sync.WaitGroup
	mu  sync.Mutex
	cs  []net.Conn
}

func newEcho(t *testing.T) *echoServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{lis: lis}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.cs = append(e.cs, c)
			e.mu.Unlock()
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				_, _ = io.Copy(c, c)
				_ = c.Close()
			}()
		}
	}()
	t.Cleanup(e.close)
	return e
}

func (e *echoServer) addr() string { return e.lis.Addr().String() }

func (e *echoServer) close() {
	_ = e.lis.Close()
	e.mu.Lock()
	for _, c := range e.cs {
		_ = c.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip writes msg and reads its echo within d.
func roundTrip(c net.Conn, msg []byte, d time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(d))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return errors.New("echo differs")
	}
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// expectHang checks that nothing comes back from c within d.
func expectHang(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	n, err := c.Read(make([]byte, 1))
	if !isTimeout(err) {
		t.Fatalf("read through a blackhole: n=%d err=%v, want a timeout", n, err)
	}
}

func TestPass(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.addr())
	if p.Target() != e.addr() {
		t.Fatalf("Target %s", p.Target())
	}
	c := dial(t, p.Addr())
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB: many chunks
	if err := roundTrip(c, big, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// EOF travels through: the echo server closes after our half-close.
	_ = c.(*net.TCPConn).CloseWrite()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after half-close: n=%d err=%v, want EOF", n, err)
	}
}

func TestBlackholeHangsThenHeals(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.addr())
	open := dial(t, p.Addr())
	if err := roundTrip(open, []byte("before"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	if m, _ := p.Mode(); m != Blackhole {
		t.Fatalf("mode %v", m)
	}
	// An open connection hangs; a new one is accepted and hangs too.
	if _, err := open.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	expectHang(t, open, 300*time.Millisecond)
	fresh := dial(t, p.Addr())
	if _, err := fresh.Write([]byte("new!")); err != nil {
		t.Fatal(err)
	}
	expectHang(t, fresh, 300*time.Millisecond)

	// Heal: what was held arrives, and traffic flows again.
	p.Heal()
	for _, c := range []net.Conn{open, fresh} {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got := make([]byte, 4)
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatalf("held bytes after heal: %v", err)
		}
		_ = c.SetReadDeadline(time.Time{})
		if err := roundTrip(c, []byte("after"), 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReset(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.addr())
	open := dial(t, p.Addr())
	if err := roundTrip(open, []byte("x"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Reset()
	_ = open.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := open.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("open connection after Reset: %v, want a reset", err)
	}
	// A new connection is reset at once (the dial itself may succeed).
	c, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second)
	if err == nil {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		_ = c.Close()
		if err == nil || isTimeout(err) {
			t.Fatalf("new connection under Reset: %v, want a reset", err)
		}
	}
	p.Heal()
	if err := roundTrip(dial(t, p.Addr()), []byte("healed"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestDelay(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.addr())
	c := dial(t, p.Addr())
	const d = 100 * time.Millisecond
	p.Delay(d)
	if m, got := p.Mode(); m != Pass || got != d {
		t.Fatalf("mode %v delay %v", m, got)
	}
	t0 := time.Now()
	if err := roundTrip(c, []byte("slow"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(t0); rtt < 2*d {
		t.Fatalf("round trip %v with %v each way", rtt, d)
	}
	p.Heal()
	t0 = time.Now()
	if err := roundTrip(c, []byte("fast"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(t0); rtt >= 2*d {
		t.Fatalf("round trip %v after Heal", rtt)
	}
}

func TestDeadTargetIsReset(t *testing.T) {
	e := newEcho(t)
	addr := e.addr()
	e.close()
	p := newProxy(t, addr)
	// The reset may come before the dial returns or at the first read.
	c, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second)
	if err != nil {
		return
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("connection to a dead target: %v, want a reset or EOF", err)
	}
}

// TestCloseWhileHung closes a proxy with connections held in a blackhole
// and a writer blocked on a full pipe: every goroutine ends.
func TestCloseWhileHung(t *testing.T) {
	e := newEcho(t)
	p, err := New(e.addr())
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	if err := roundTrip(c, []byte("x"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	_, _ = c.Write(make([]byte, 1<<20))
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	p.Heal() // after Close: no effect, no panic
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("dial after Close succeeded")
	}
}

// TestConcurrentFaults flips modes at random while clients stream through
// the proxy; after a final Heal every client completes a round trip on a
// fresh connection. Run with -race.
func TestConcurrentFaults(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("FAULTPROXY_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (FAULTPROXY_SEED)", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	e := newEcho(t)
	p := newProxy(t, e.addr())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
				if err != nil {
					continue
				}
				for j := 0; j < 20 && roundTrip(c, []byte("ping"), 50*time.Millisecond) == nil; j++ {
				}
				_ = c.Close()
			}
		}()
	}
	for i := 0; i < 40; i++ {
		switch r.IntN(4) {
		case 0:
			p.Heal()
		case 1:
			p.Blackhole()
		case 2:
			p.Reset()
		case 3:
			p.Delay(time.Duration(r.IntN(5)) * time.Millisecond)
		}
		time.Sleep(time.Duration(r.IntN(20)) * time.Millisecond) // let traffic run under this fault
	}
	p.Heal()
	close(stop)
	wg.Wait()
	if err := roundTrip(dial(t, p.Addr()), []byte("final"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
}
