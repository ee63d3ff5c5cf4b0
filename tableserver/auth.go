package tableserver

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/auth"
	"github.com/tabuladb/tabula/internal/tlsfiles"
)

// keyRefreshEvery bounds how often a signature that does not verify makes
// the server fetch the tenants' keys again.
const keyRefreshEvery = time.Second

// unknownRefreshEvery is keyRefreshEvery for a principal the server holds
// no keys of (a tenant created a moment ago, before the heartbeat that
// brings its version): such a signature fetches at once unless that
// principal made a fetch less than this ago, and at most
// unknownRefreshBurst such fetches go out per keyRefreshEvery, so made-up
// principals cannot flood the master.
const (
	unknownRefreshEvery = time.Second
	unknownRefreshBurst = 8
)

// credential is the cluster credential the server signs its own calls
// with (master, other servers' extent nodes); zero when authentication is
// off.
func (s *Server) credential() auth.Credential {
	if s.opts.ClusterKey == nil {
		return auth.Credential{}
	}
	return auth.Credential{Principal: auth.ClusterPrincipal, Key: s.opts.ClusterKey}
}

// dialOptions sign every call with the cluster credential and dial with
// DialTLS when set.
func (s *Server) dialOptions() []grpc.DialOption {
	return append(s.credential().DialOptions(), tlsfiles.DialOption(s.opts.DialTLS)...)
}

// authInterceptors check every call's signature (none when authentication
// is off); they run before admission control, so an unsigned flood is
// refused before it takes a slot.
func (s *Server) authInterceptors() []grpc.ServerOption {
	if s.opts.ClusterKey == nil {
		return nil
	}
	s.keys = &keyring{s: s}
	v := auth.NewVerifier(auth.VerifierOptions{Keys: s.keys, Logger: s.log, Digests: s.limits.guard.TakeDigest})
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(v.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(v.StreamServerInterceptor()),
	}
}

// keyring holds the cluster key and the tenants' keys, fetched from the
// master (TenantKeys) when a heartbeat reports a new tenants version, and
// when a signature does not verify (at most every keyRefreshEvery).
type keyring struct {
	s       *Server
	tenants atomic.Pointer[map[string][][]byte]
	version atomic.Uint64 // of the keys held; 0 before the first fetch

	mu        sync.Mutex // one fetch at a time
	fetches   uint64     // guarded by mu
	lastFetch time.Time  // guarded by mu
	// Fetches for unknown principals (unknownRefreshEvery): when each
	// principal last made one, and the window's count. Guarded by mu.
	unknownAt     map[string]time.Time
	unknownWindow time.Time
	unknownN      int
}

func (k *keyring) Key(principal string, id int) []byte {
	if principal == auth.ClusterPrincipal {
		if id == 0 {
			return k.s.opts.ClusterKey
		}
		return nil
	}
	m := k.tenants.Load()
	if m == nil || id < 1 || id > len((*m)[principal]) {
		return nil
	}
	return (*m)[principal][id-1]
}

// Refresh fetches the keys again unless a fetch finished less than
// keyRefreshEvery ago; it reports whether keys were fetched since the
// caller looked (by this call or one it waited for).
func (k *keyring) Refresh(ctx context.Context, principal string) bool {
	k.mu.Lock()
	before := k.fetches
	force := k.unknownLocked(principal, time.Now())
	k.mu.Unlock()
	return k.fetch(ctx, before, force) // waits behind a fetch under way
}

// unknownLocked reports whether principal, of which no keys are held, may
// fetch now regardless of keyRefreshEvery; the caller holds mu.
func (k *keyring) unknownLocked(principal string, now time.Time) bool {
	if principal == auth.ClusterPrincipal {
		return false
	}
	if m := k.tenants.Load(); m != nil {
		if _, ok := (*m)[principal]; ok {
			return false // known: a wrong or rotated key waits keyRefreshEvery
		}
	}
	if now.Sub(k.unknownWindow) >= keyRefreshEvery {
		k.unknownWindow, k.unknownN = now, 0
	}
	if k.unknownN >= unknownRefreshBurst || now.Sub(k.unknownAt[principal]) < unknownRefreshEvery {
		return false
	}
	if k.unknownAt == nil || len(k.unknownAt) >= 1024 {
		k.unknownAt = map[string]time.Time{}
	}
	k.unknownAt[principal] = now
	k.unknownN++
	return true
}

// noteVersion is a heartbeat's tenants version: a different one fetches
// the keys in the background.
func (k *keyring) noteVersion(v uint64) {
	if v == k.version.Load() {
		return
	}
	k.s.wg.Add(1)
	go func() {
		defer k.s.wg.Done()
		ctx, cancel := context.WithTimeout(k.s.ctx, 5*time.Second)
		defer cancel()
		k.mu.Lock()
		before := k.fetches
		k.mu.Unlock()
		k.fetch(ctx, before, true)
	}()
}

// fetch gets every tenant's keys from the master, unless one was fetched
// since the caller saw before (then it reports true at once) or, without
// force, less than keyRefreshEvery ago (then it reports whether any keys
// are held, so the caller checks again).
func (k *keyring) fetch(ctx context.Context, before uint64, force bool) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.fetches != before {
		return true
	}
	if !force && time.Since(k.lastFetch) < keyRefreshEvery {
		// Too soon to fetch again; but a fetch may have finished after
		// the caller's check (another caller's, for the same new
		// tenant): a second check is cheap.
		return k.fetches > 0
	}
	k.lastFetch = time.Now()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var resp *api.TenantKeysResponse
	err := k.s.withMaster(ctx, func(mc api.MasterClient) error {
		var err error
		resp, err = mc.TenantKeys(ctx, &api.TenantKeysRequest{})
		return err
	})
	if err != nil {
		k.s.log.Warn("tableserver: fetch tenant keys", "err", err)
		return false
	}
	m := make(map[string][][]byte, len(resp.GetTenants()))
	for _, t := range resp.GetTenants() {
		m[t.GetName()] = t.GetKeys()
	}
	k.tenants.Store(&m)
	k.version.Store(resp.GetVersion())
	k.fetches++
	return true
}
