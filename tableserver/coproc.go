package tableserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/coproc"
)

// Coprocessors on a table server: every version a hosted table lists in
// the map is fetched from the master and compiled in the background (never
// on the request path), then reported ready in heartbeats; the master moves
// a coprocessor's live alias once every hosting server has it. Invoke runs
// one guest call on one partition.

// coprocs tracks the module versions this server has compiled.
type coprocs struct {
	rt *coproc.Runtime
	mu sync.Mutex
	// state by key: compiling (errCompiling, wrapping the last failure
	// while a failed compile waits to be retried), ready (nil), or failed
	// (the version left the map or the server closed; compiled again if
	// a later map lists it).
	state map[coproc.ModuleKey]error
}

var errCompiling = errors.New("tableserver: compiling")

// syncCoprocs starts compiling every version listed for the tables this
// server hosts that it has not compiled. Only the watch goroutine calls it.
func (s *Server) syncCoprocs(h *hosting) {
	hostedTables := map[string]bool{}
	for _, r := range h.replicas {
		hostedTables[tableKey(r.table.GetTenant(), r.table.GetName())] = true
	}
	for key, m := range h.tables {
		if !hostedTables[key] {
			continue
		}
		t := m.GetTable()
		for _, c := range m.GetCoprocessors() {
			for _, v := range c.GetVersions() {
				k := coproc.ModuleKey{Tenant: t.GetTenant(), Table: t.GetName(), Name: c.GetName(), Version: v.GetVersion()}
				s.cp.mu.Lock()
				st, known := s.cp.state[k]
				if known && (st == nil || errors.Is(st, errCompiling)) {
					s.cp.mu.Unlock()
					continue
				}
				s.cp.state[k] = errCompiling
				s.cp.mu.Unlock()
				s.wg.Add(1)
				go func() {
					defer s.wg.Done()
					// A failed compile (the master unreachable, a deadline
					// passed on a loaded machine) is retried while the
					// version is still listed: nothing else would retry it
					// on a map that does not change, and the version would
					// never go live.
					for attempt := 0; ; attempt++ {
						err := s.compile(k, v.GetSha256())
						if err == nil {
							break
						}
						s.log.Error("coprocessor did not compile; retrying", "table", t.GetName(), "name", k.Name, "version", k.Version, "attempt", attempt+1, "err", err)
						s.cp.mu.Lock()
						s.cp.state[k] = fmt.Errorf("%w (the last attempt failed: %w)", errCompiling, err)
						s.cp.mu.Unlock()
						if !s.coprocListed(k) || !s.backoff(attempt+3) {
							s.cp.mu.Lock()
							s.cp.state[k] = err
							s.cp.mu.Unlock()
							return
						}
					}
					s.cp.mu.Lock()
					s.cp.state[k] = nil
					s.cp.mu.Unlock()
					s.log.Info("coprocessor compiled", "table", t.GetName(), "name", k.Name, "version", k.Version)
					if err := s.heartbeat(false); err != nil {
						s.log.Debug("heartbeat after compile failed; the next one reports it", "err", err)
					}
				}()
			}
		}
	}
}

// coprocListed reports whether the map this server holds still lists
// module version k for a table it hosts.
func (s *Server) coprocListed(k coproc.ModuleKey) bool {
	m, ok := s.hosting.Load().tables[tableKey(k.Tenant, k.Table)]
	if !ok {
		return false
	}
	for _, c := range m.GetCoprocessors() {
		if c.GetName() != k.Name {
			continue
		}
		for _, v := range c.GetVersions() {
			if v.GetVersion() == k.Version {
				return true
			}
		}
	}
	return false
}

// compile fetches module k from the master and compiles it.
func (s *Server) compile(k coproc.ModuleKey, sum string) error {
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Minute)
	defer cancel()
	var resp *api.CoprocFetchResponse
	err := s.withMaster(ctx, func(mc api.MasterClient) error {
		var err error
		resp, err = mc.CoprocFetch(ctx, &api.CoprocFetchRequest{Tenant: k.Tenant, Table: k.Table, Name: k.Name, Version: k.Version})
		return err
	})
	if err != nil {
		return fmt.Errorf("fetch module: %w", err)
	}
	if got := sha256.Sum256(resp.GetWasm()); hex.EncodeToString(got[:]) != sum {
		return fmt.Errorf("fetched module does not match its sha256 %s", sum)
	}
	_, err = s.cp.rt.Compile(ctx, k, resp.GetWasm())
	return err
}

// coprocReady lists the compiled versions of hosted tables.
func (s *Server) coprocReady(h *hosting) []*api.CoprocReady {
	s.cp.mu.Lock()
	defer s.cp.mu.Unlock()
	var out []*api.CoprocReady
	for k, err := range s.cp.state {
		if err != nil {
			continue
		}
		if _, ok := h.tables[tableKey(k.Tenant, k.Table)]; !ok {
			continue
		}
		out = append(out, &api.CoprocReady{Tenant: k.Tenant, Table: k.Table, Name: k.Name, Version: k.Version})
	}
	return out
}

// moduleFor resolves a request's coprocessor version (0: live) and checks
// it is compiled here.
func (s *Server) moduleFor(r *replica, h *hosting, name string, version uint64) (coproc.ModuleKey, error) {
	k := coproc.ModuleKey{Tenant: r.table.GetTenant(), Table: r.table.GetName(), Name: name}
	m := h.tables[tableKey(k.Tenant, k.Table)]
	var c *api.Coprocessor
	for _, x := range m.GetCoprocessors() {
		if x.GetName() == name {
			c = x
		}
	}
	if c == nil {
		return k, api.Errorf(api.ErrorCode_ERROR_CODE_NOT_FOUND, "coprocessor_not_found", "table %s/%s has no coprocessor %q", k.Tenant, k.Table, name)
	}
	if version == 0 {
		version = c.GetLive()
		if version == 0 {
			return k, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "coproc_not_ready", "coprocessor %q has no live version yet (compiling on the servers)", name)
		}
	}
	k.Version = version
	s.cp.mu.Lock()
	st, known := s.cp.state[k]
	s.cp.mu.Unlock()
	switch {
	case !known || errors.Is(st, errCompiling):
		return k, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "coproc_compiling", "coprocessor %q version %d is not compiled on %s yet", name, version, s.id())
	case st != nil:
		return k, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "coproc_compile_failed", "coprocessor %q version %d did not compile on %s: %v", name, version, s.id(), st)
	}
	return k, nil
}

// coprocErr maps a runtime error to the API's error model.
func coprocErr(err error) error {
	var ge *coproc.GuestError
	switch {
	case errors.As(err, &ge):
		return api.Errorf(api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "guest_error", "%v", err)
	case errors.Is(err, coproc.ErrBusy):
		return api.Status(&api.ErrorDetail{Code: api.ErrorCode_ERROR_CODE_SERVER_BUSY, Reason: "coproc_busy", RetryAfterMs: 10}, err.Error())
	case errors.Is(err, coproc.ErrUnknownMethod):
		return api.Errorf(api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "unknown_method", "%v", err)
	case errors.Is(err, coproc.ErrReservedKey):
		return api.InvalidArgument("keys", "reserved_key", 0, "%v", err)
	case errors.Is(err, coproc.ErrInputTooLarge):
		return api.InvalidArgument("input", "input_too_large", 0, "%v", err)
	case errors.Is(err, coproc.ErrDeadline):
		return api.Errorf(api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "guest_deadline", "%v", err)
	case errors.Is(err, coproc.ErrMemoryLimit):
		return api.Errorf(api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "guest_memory_limit", "%v", err)
	case errors.Is(err, coproc.ErrTrap), errors.Is(err, coproc.ErrGuestFault):
		return api.Errorf(api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "guest_trap", "%v", err)
	case errors.Is(err, coproc.ErrTokenReused):
		return api.InvalidArgument("idempotency_token", "token_reused", 0, "%v", err)
	case errors.Is(err, coproc.ErrTokenTooLong):
		return api.InvalidArgument("idempotency_token", "token_too_long", coproc.MaxTokenBytes, "%v", err)
	case errors.Is(err, coproc.ErrOutputTooLarge), errors.Is(err, coproc.ErrWritesTooLarge):
		return api.Errorf(api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "guest_limit", "%v", err)
	case errors.Is(err, coproc.ErrReadOnly):
		return api.Errorf(api.ErrorCode_ERROR_CODE_WRONG_KIND, "read_only_kind", "%v", err)
	}
	return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "coproc_failed", "%v", err)
}

// Invoke implements api.TableServerServer.
func (s *service) Invoke(ctx context.Context, req *api.InvokeRequest) (*api.InvokeResponse, error) {
	r, h, err := s.replicaFor(req.GetHeader())
	if err != nil {
		return nil, err
	}
	if err := api.ValidateName("name", req.GetName()); err != nil {
		return nil, err
	}
	for i, k := range req.GetKeys() {
		if err := checkKeyAt(r, h, i, k); err != nil {
			return nil, err
		}
	}
	key, err := s.moduleFor(r, h, req.GetName(), req.GetVersion())
	if err != nil {
		return nil, err
	}
	if err := s.quota.coproc(r.table.GetTenant(), time.Now()); err != nil {
		return nil, err
	}
	cr := coproc.CallRequest{
		Partition: r.cpart, Input: req.GetInput(), Keys: req.GetKeys(),
		Range:     coproc.KeyRange{Start: nonEmpty(req.GetRangeStart()), End: nonEmpty(req.GetRangeEnd())},
		RequestID: req.GetRequestId(), IdempotencyToken: req.GetIdempotencyToken(),
	}
	if ms := req.GetTimeoutMs(); ms > 0 {
		cr.Deadline = time.Now().Add(time.Duration(ms) * time.Millisecond)
	}
	res, err := s.cp.rt.Call(ctx, key, req.GetMethod(), cr)
	if err != nil {
		return nil, coprocErr(err)
	}
	return &api.InvokeResponse{Output: res.Output, Version: key.Version}, nil
}

func nonEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// CoprocMerge implements api.TableServerServer.
func (s *service) CoprocMerge(ctx context.Context, req *api.CoprocMergeRequest) (*api.CoprocMergeResponse, error) {
	r, h, err := s.replicaFor(req.GetHeader())
	if err != nil {
		return nil, err
	}
	key, err := s.moduleFor(r, h, req.GetName(), req.GetVersion())
	if err != nil {
		return nil, err
	}
	out, err := s.cp.rt.Merge(ctx, key, req.GetMethod(), req.GetPartials())
	if err != nil {
		return nil, coprocErr(err)
	}
	return &api.CoprocMergeResponse{Output: out}, nil
}
