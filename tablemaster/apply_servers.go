package tablemaster

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

// The servers and liveness sub-machine: OpRegisterServer, OpServerDown,
// OpForgetServer.

// ValidateServerID checks a server id: 1 to 128 printable ASCII characters
// other than space and '/'.
func ValidateServerID(field, id string) error {
	if id == "" {
		return errInvalid(field, "server_id_empty", 0, "%s is empty", field)
	}
	if len(id) > MaxServerIDLen {
		return errInvalid(field, "server_id_too_long", MaxServerIDLen, "%s is %d bytes; the limit is %d", field, len(id), MaxServerIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' || c == '/' {
			return errInvalid(field, "server_id_invalid", 0, "%s %q holds a character other than printable ASCII (no space or '/')", field, id)
		}
	}
	return nil
}

// DefaultFaultDomain is the fault domain of a server that names none: a
// domain of its own, derived from its id, so it is stable across restarts
// (the id lives in the server's data directory) and replicas of one
// partition never share a server by accident. Servers that share a rack or
// a host should name their domain (tabula server --fault-domain).
func DefaultFaultDomain(serverID string) string { return "server:" + serverID }

// registerServer adds a server or brings a known one back.
//
// A known id is a process identity, (Incarnation, Addr): a server picks a
// new random incarnation at every start and keeps its address for its life.
// While the id is alive and not draining, a registration with another
// identity is refused (ALREADY_EXISTS, reason server_id_in_use) unless
// HolderSilent: two processes with one id (a copied data directory, a
// restart while the old process still runs) would otherwise both hold the
// id's replicas in one epoch. The refused process retries; it gets in once
// the old one drained (a draining server admits no request), or has been
// silent longer than its lease (HolderSilent: it serves nothing, its lease
// ran out by its own clock), or was declared dead. It then takes over the
// replicas the id still holds at their current epoch.
//
// Refusing was chosen over bumping those replicas' epochs: a bump does not
// stop an old process that still heartbeats (heartbeats carry no
// incarnation) from following the map and serving at the new epoch, and
// today's table server moves a durable partition's directory aside when it
// opens it at an epoch other than the one on disk, so a bump on every
// restart would empty every restarted single-copy partition. The price is
// that a server restarted after a crash waits out the old process's lease
// (1s) before it serves again; a drained one (SIGTERM) registers at once.
//
// The same identity again (the master restarted, or declared the server
// dead while it was cut off) changes nothing but liveness. Incarnation 0 is
// a server from before incarnations: its identity is its address.
func (s *State) registerServer(cmd *RegisterServer, chk bool) (Result, error) {
	if chk {
		if err := checkRegistration(cmd); err != nil {
			return Result{}, err
		}
	}
	srv, ok := s.Servers[cmd.ServerID]
	if chk && ok && srv.Alive && !srv.Draining && !cmd.HolderSilent && (srv.Addr != cmd.Addr || srv.Incarnation != 0 && srv.Incarnation != cmd.Incarnation) {
		return Result{}, errCode(ErrServerInUse, api.ErrorCode_ERROR_CODE_ALREADY_EXISTS, "server_id_in_use",
			"server id %s is held by a live process (addr %s, incarnation %x); this one (addr %s, incarnation %x) may register once that one drains, or stays silent past its lease",
			cmd.ServerID, srv.Addr, srv.Incarnation, cmd.Addr, cmd.Incarnation)
	}
	changed := false
	id := cmd.ServerID
	if id == "" {
		for {
			id = fmt.Sprintf("srv-%d", s.NextServerID)
			s.NextServerID++
			if _, taken := s.Servers[id]; !taken {
				break
			}
		}
		changed = true
	}
	fd := cmd.FaultDomain
	if fd == "" {
		fd = DefaultFaultDomain(id)
	}
	srv, ok = s.Servers[id]
	switch {
	case !ok:
		srv = &Server{ID: id, Addr: cmd.Addr, InternalAddr: cmd.InternalAddr, FaultDomain: fd, Alive: true, Incarnation: cmd.Incarnation, BulkCapacity: cmd.BulkCapacity}
		s.serversW()[id] = srv
		s.ownNewServer(srv)
		changed = true
	case !srv.Alive || srv.Draining || srv.Addr != cmd.Addr || srv.InternalAddr != cmd.InternalAddr || srv.FaultDomain != fd || srv.Incarnation != cmd.Incarnation || srv.BulkCapacity != cmd.BulkCapacity:
		// A returning server (or a new process of a dead or drained one,
		// or a server from before incarnations that now sends one). Its
		// old partitions were moved when it died; the ones it still holds
		// (durable single copies, or it drained) get its new address.
		srv = s.mutServer(id)
		srv.Alive, srv.Draining, srv.Addr, srv.FaultDomain, srv.DownSinceMs = true, false, cmd.Addr, fd, 0
		srv.InternalAddr = cmd.InternalAddr
		srv.Incarnation = cmd.Incarnation
		srv.BulkCapacity = cmd.BulkCapacity
		for _, t := range s.Tables {
			if !t.staleAddr(id, cmd.Addr, fd) {
				continue
			}
			t = s.mutTable(t)
			for i := range t.Partitions {
				for j := range t.Partitions[i].Replicas {
					if r := &t.Partitions[i].Replicas[j]; r.ServerID == id {
						r.Addr, r.FaultDomain = cmd.Addr, fd
					}
				}
			}
		}
		// Replicas kept while it was away (Command.Keep) rejoin the log:
		// its next extent includes them, and they catch up from it.
		for _, t := range s.Tables {
			if !t.replicatesByLog() || !slices.ContainsFunc(t.Partitions, func(p Partition) bool { return hostsReplica(&p, id) }) {
				continue
			}
			t = s.mutTable(t)
			for i := range t.Partitions {
				if hostsReplica(&t.Partitions[i], id) {
					t.Partitions[i].resetLog()
				}
			}
		}
		changed = true
	}
	moved := s.placeShort(s.candidates())
	if changed {
		// Every table server is an extent node too, on its internal
		// listener when it has one.
		nodeAddr := cmd.Addr
		if cmd.InternalAddr != "" {
			nodeAddr = cmd.InternalAddr
		}
		s.streamNodeEvent(stream.Command{Op: stream.OpAddNode, Node: id, Addr: nodeAddr, FaultDomain: fd})
	}
	return Result{Changed: changed || len(moved) > 0, ServerID: id, Moved: moved}, nil
}

func (s *State) serverDown(cmd *ServerDown, unixMs int64, chk bool) (Result, error) {
	if err := checkServerID(chk, cmd.ServerID); err != nil {
		return Result{}, err
	}
	srv, ok := s.Servers[cmd.ServerID]
	if !ok {
		return Result{}, errServerNotFound(cmd.ServerID)
	}
	changed := false
	switch {
	case cmd.Force:
		if chk && srv.Alive {
			return Result{}, errInvalid("force", "server_alive", 0, "server %s is alive: only a dead server's partitions can be forced off it", cmd.ServerID)
		}
	case cmd.Draining && srv.Alive && !srv.Draining:
		srv = s.mutServer(cmd.ServerID)
		srv.Draining = true
		changed = true
	case !cmd.Draining && srv.Alive:
		// A draining server that goes silent (SIGTERM: it exits once its
		// in-flight requests are done) stays draining: moveLoop goes on
		// moving its replicas off, copied from the others, rather than
		// leaving them a replica short until ReplaceAfter.
		srv = s.mutServer(cmd.ServerID)
		srv.Alive, srv.DownSinceMs = false, unixMs
		srv.Draining = srv.Draining && cmd.Keep
		changed = true
		s.streamNodeEvent(stream.Command{Op: stream.OpNodeDown, Node: cmd.ServerID})
	}
	if cmd.Replace && chk && srv.Alive {
		return Result{}, errInvalid("replace", "server_alive", 0, "server %s is alive: only a dead server's replicas are replaced", cmd.ServerID)
	}
	if !changed && !cmd.Force && !cmd.Replace {
		return Result{}, nil // already down: it holds only durable partitions, or kept replicas
	}
	cands := s.candidates()
	var moved, held []uint64
	for _, t := range s.tablesByID() {
		for i := range t.Partitions {
			p := &t.Partitions[i]
			k := slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.ServerID == cmd.ServerID })
			if k < 0 {
				continue
			}
			if !cmd.Force && t.onlyCopy(i) {
				// Its data is on this server's disk and nowhere else:
				// moving it would serve an empty partition. It waits,
				// unavailable, for the server to come back, or for an
				// operator to accept the loss (OpForgetServer). A bulk
				// partition whose versions are all in streams moves:
				// its new server fetches them.
				held = append(held, p.ID)
				continue
			}
			if cmd.Replace && slices.Contains(cmd.Hold, p.ID) {
				held = append(held, p.ID)
				continue
			}
			if cmd.Keep && !cmd.Replace && t.replicatesByLog() && len(p.Replicas) > 1 {
				t = s.mutTable(t)
				promote, named := cmd.Promote[t.Partitions[i].ID]
				s.demoteReplica(t, i, k, promote, named && promote == "")
				moved = append(moved, t.Partitions[i].ID)
				continue
			}
			t = s.mutTable(t)
			p = &t.Partitions[i]
			s.dropReplica(t, i, k, cmd.Promote[p.ID], cands)
			moved = append(moved, p.ID)
		}
	}
	return Result{Changed: changed || len(moved) > 0, Moved: moved, Held: held}, nil
}

// demoteReplica keeps replica k of partition i of t (its server died or
// drains; see Command.Keep): if it was the primary, a live replica
// (promote, the proposer's choice, else the first live one) takes the
// role and the epoch is bumped once; the log is reconfigured either way,
// so its next extent leaves the replica out. With no live replica left, or
// none fit (wait: the proposer named nobody, no other replica having
// reported holding the data), the primary stays where it is: the
// partition waits for its server.
func (s *State) demoteReplica(t *Table, i, k int, promote string, wait bool) {
	p := &t.Partitions[i]
	p.resetLog()
	if p.Replicas[k].Role != api.ReplicaRole_REPLICA_ROLE_PRIMARY || wait {
		return
	}
	live := func(j int) bool {
		srv := s.Servers[p.Replicas[j].ServerID]
		return j != k && srv != nil && srv.Alive && !srv.Draining
	}
	j := slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.ServerID == promote })
	if j < 0 || !live(j) {
		j = -1
		for c := range p.Replicas {
			if live(c) {
				j = c
				break
			}
		}
	}
	if j < 0 {
		return
	}
	if s.primaries != nil {
		s.primaries[p.Replicas[k].ServerID]--
		s.primaries[p.Replicas[j].ServerID]++
	}
	p.Replicas[k].Role = api.ReplicaRole_REPLICA_ROLE_SECONDARY
	p.Replicas[j].Role = api.ReplicaRole_REPLICA_ROLE_PRIMARY
	p.Replicas[0], p.Replicas[j] = p.Replicas[j], p.Replicas[0]
	p.Epoch++
}

// dropReplica removes replica k of partition i of t, promotes a remaining
// one if it was the primary, places replacements and bumps the epoch once.
func (s *State) dropReplica(t *Table, i, k int, promote string, cands []Candidate) {
	p := &t.Partitions[i]
	t.Bulk.forgetLoaded(i, p.Replicas[k].ServerID) // its files go with it
	wasPrimary := p.Replicas[k].Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY
	if wasPrimary && s.primaries != nil {
		s.primaries[p.Replicas[k].ServerID]--
	}
	p.Replicas = slices.Delete(p.Replicas, k, k+1)
	p.resetLog() // the next extent goes to the remaining replicas
	epoch := p.Epoch
	if wasPrimary && len(p.Replicas) > 0 {
		// The most caught-up secondary (promote: the proposer's choice,
		// from the replicas' reports) is promoted; else the first.
		j := max(0, slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.ServerID == promote }))
		p.Replicas[j].Role = api.ReplicaRole_REPLICA_ROLE_PRIMARY
		p.Replicas[0], p.Replicas[j] = p.Replicas[j], p.Replicas[0]
		if s.primaries != nil {
			s.primaries[p.Replicas[0].ServerID]++
		}
	}
	s.fill(t, i, cands) // bumps the epoch if it picks a new primary
	if wasPrimary && p.Epoch == epoch {
		// Exactly one bump per change of primary. A secondary's removal
		// keeps the epoch: the primary's term goes on (its log continues
		// on the next extent).
		p.Epoch++
	}
}

// onlyCopy reports whether partition i of t keeps its data on one server
// and nowhere else: durable, one replica, and not a bulk partition whose
// versions are all in streams (a new server fetches those).
func (t *Table) onlyCopy(i int) bool {
	return t.durable() && len(t.Partitions[i].Replicas) == 1 && !t.bulkMovable(i)
}

// forgetServer removes a dead server and moves every partition it still
// holds; see OpForgetServer.
func (s *State) forgetServer(cmd *ForgetServer, unixMs int64, chk bool) (Result, error) {
	if err := checkServerID(chk, cmd.ServerID); err != nil {
		return Result{}, err
	}
	srv, ok := s.Servers[cmd.ServerID]
	if !ok {
		return Result{}, errServerNotFound(cmd.ServerID)
	}
	if chk && srv.Alive {
		return Result{}, errInvalid("server_id", "server_alive", 0,
			"server %s is alive (or not yet declared dead): only a dead server can be forgotten; stop it first, or drain it (SIGTERM) to move its partitions without loss", cmd.ServerID)
	}
	type hit struct {
		t    *Table
		i, k int
	}
	var hits []hit
	var lost []string
	for _, t := range s.tablesByID() {
		for i := range t.Partitions {
			k := slices.IndexFunc(t.Partitions[i].Replicas, func(r Replica) bool { return r.ServerID == cmd.ServerID })
			if k < 0 {
				continue
			}
			hits = append(hits, hit{t, i, k})
			if t.onlyCopy(i) {
				lost = append(lost, fmt.Sprintf("%s/%s#%d", t.Tenant, t.Name, t.Partitions[i].Index))
			}
		}
	}
	if chk && len(lost) > 0 && !cmd.AcceptDataLoss {
		const show = 10
		names := strings.Join(lost[:min(len(lost), show)], ", ")
		if len(lost) > show {
			names += fmt.Sprintf(" and %d more", len(lost)-show)
		}
		return Result{}, errInvalid("accept_data_loss", "data_loss_not_accepted", 0,
			"server %s holds the only copy of %d partition(s) (%s): forgetting it moves them to other servers EMPTY; "+
				"bring the server back instead, or accept the loss explicitly (accept_data_loss, tabula server forget --accept-data-loss)",
			cmd.ServerID, len(lost), names)
	}
	// Validation is over: mutate.
	delete(s.serversW(), cmd.ServerID)
	cands := s.candidates()
	res := Result{Changed: true}
	for _, h := range hits {
		h.t = s.mutTable(h.t)
		p := &h.t.Partitions[h.i]
		if h.t.onlyCopy(h.i) {
			p.DataLost = &DataLoss{UnixMs: unixMs, ServerID: cmd.ServerID, Epoch: p.Epoch}
			res.Lost = append(res.Lost, p.ID)
			if p.Log != nil {
				// Its log's only copies were on the forgotten server: the
				// partition starts again on a new, empty log (the old one
				// could never be sealed, having no replica left).
				_, _ = s.streams().Apply(stream.Command{Op: stream.OpDeleteStream, Stream: p.Log.Stream})
				p.Log = &PartitionLog{Stream: fmt.Sprintf("%s/lost-%d", LogStreamName(p.ID), p.Epoch)}
			}
		}
		s.dropReplica(h.t, h.i, h.k, "", cands)
		res.Moved = append(res.Moved, p.ID)
	}
	return res, nil
}

// checkServerID is ValidateServerID("server_id") at proposal (chk).
func checkServerID(chk bool, id string) error {
	if !chk {
		return nil
	}
	return ValidateServerID("server_id", id)
}

// checkRegistration checks the fields of an OpRegisterServer.
func checkRegistration(cmd *RegisterServer) error {
	if cmd.ServerID != "" {
		if err := ValidateServerID("server_id", cmd.ServerID); err != nil {
			return err
		}
	}
	if cmd.Addr == "" {
		return errInvalid("addr", "addr_empty", 0, "addr is empty")
	}
	if strings.ContainsAny(cmd.Addr, " \t\r\n") || len(cmd.Addr) > 255 {
		return errInvalid("addr", "addr_invalid", 255, "addr %q must be host:port, at most 255 bytes", cmd.Addr)
	}
	if strings.ContainsAny(cmd.InternalAddr, " \t\r\n") || len(cmd.InternalAddr) > 255 {
		return errInvalid("internal_addr", "addr_invalid", 255, "internal_addr %q must be host:port, at most 255 bytes", cmd.InternalAddr)
	}
	if len(cmd.FaultDomain) > api.MaxNameLen {
		return errInvalid("fault_domain", "fault_domain_too_long", api.MaxNameLen, "fault_domain is %d bytes; the limit is %d", len(cmd.FaultDomain), api.MaxNameLen)
	}
	return nil
}
