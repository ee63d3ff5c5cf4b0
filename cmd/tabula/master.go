package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/tablemaster"
	"github.com/tabuladb/tabula/tablemaster/splitpolicy"
)

func masterCmd(g *globals) *cobra.Command {
	var (
		listen         string
		internalListen string
		dir            string
		peers          string
		metricsListen  string
		dashListen     string
		debug          string
		autoSplit      bool
		opts           tablemaster.Options
	)
	cmd := &cobra.Command{
		Use:   "master",
		Short: "Run the Table Master (alone, or one member of a raft group with --id and --peers)",
		Long: `Run the Table Master. Alone by default; with --id and --peers it is one member of a
group of 3 or 5 masters on raft: one leads (the others answer with its address, and
servers, clients and the CLI follow it from any address in --master), and the group
survives the loss of a minority. Example, three members:

  tabula master --id 1 --peers 1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103 --data m1
  tabula master --id 2 --peers 1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103 --data m2
  tabula master --id 3 --peers 1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103 --data m3
  tabula --master 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 server --data s1

A member joining a running group starts with --id and no --peers, then is added by
"tabula master add ID ADDR".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			opts.DataDir, opts.Logger = dir, log
			opts.DisableAutoSplit = !autoSplit
			if peers != "" && g.clusterKeyPath("") == "" {
				if _, err := os.Stat(filepath.Join(dir, "cluster.key")); err != nil {
					return fmt.Errorf("the members of a raft group share one cluster credential: give every member the same --cluster-key FILE (the first to start creates it)")
				}
			}
			cred, err := g.clusterCredential(filepath.Join(dir, "cluster.key"), true)
			if err != nil {
				return err
			}
			opts.ClusterKey = cred.Key
			if opts.TLS, err = g.tls.Server(); err != nil {
				return err
			}
			if opts.DialTLS, err = g.tls.Client(); err != nil {
				return err
			}
			if peers != "" {
				if opts.Peers, err = parsePeers(peers); err != nil {
					return err
				}
				if opts.RaftID == 0 {
					return fmt.Errorf("--peers needs --id, this member's id among them")
				}
				if addr, ok := opts.Peers[opts.RaftID]; ok && !cmd.Flags().Changed("listen") {
					listen = addr
				}
			}
			if err := serveDebug(debug, log); err != nil {
				return err
			}
			pm, err := startMetrics(metricsListen, log)
			if err != nil {
				return err
			}
			defer pm.Close()
			pm.master(&opts, nil)
			m, err := tablemaster.Open(opts)
			if err != nil {
				return err
			}
			dash, err := startDashboard(dashListen, m.DashboardHandler(), log)
			if err != nil {
				return fmt.Errorf("%w (%v)", err, m.Close())
			}
			defer dash.Close()
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen on %s: %w (%v)", listen, err, m.Close())
			}
			ia, withInternal, err := internalListenAddr(lis.Addr().String(), internalListen)
			if err != nil {
				return fmt.Errorf("%w (%v)", err, errors.Join(lis.Close(), m.Close()))
			}
			internalAddr := "none"
			if withInternal {
				ilis, err := net.Listen("tcp", ia)
				if err != nil {
					return fmt.Errorf("listen on %s (--internal-listen): %w (%v)", ia, err, errors.Join(lis.Close(), m.Close()))
				}
				internalAddr = ilis.Addr().String()
				go func() {
					if err := m.ServeInternal(ilis, ""); err != nil {
						log.Error("the internal listener stopped", "addr", internalAddr, "err", err)
					}
				}()
			}
			log.Info("master serving", "addr", lis.Addr().String(), "internal", internalAddr, "data", dir)
			go func() {
				<-cmd.Context().Done()
				log.Info("master shutting down")
				_ = m.Close()
			}()
			return m.Serve(lis)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", defaultMaster, "address to serve on (a raft member: default its address in --peers)")
	f.StringVar(&internalListen, "internal-listen", "auto", "address of the cluster's own listener (table servers' registration, heartbeats, stream and bulk calls; raft between masters, which find it by asking each other's --peers address; the cluster credential only): auto is the --listen host on a free port, none serves the cluster on --listen too")
	f.DurationVar(&opts.ReplaceAfter, "replace-after", tablemaster.DefaultReplaceAfter, "how long a dead server's replicas wait for it (its primaries fail over at once) before new ones are placed elsewhere and copy the data (negative: at once)")
	f.DurationVar(&opts.TruncateInterval, "truncate-interval", 10*time.Second, "how often partition logs are truncated below what every replica flushed")
	f.BoolVar(&opts.Rebalance, "rebalance", true, "carry out the balance plan (tabula cluster balance --dry-run shows it) every --rebalance-interval and when a server joins: primary transfers and replica moves, a few at a time (false: only on tabula cluster balance)")
	f.DurationVar(&opts.RebalanceInterval, "rebalance-interval", 5*time.Second, "time between balancing rounds with --rebalance")
	f.BoolVar(&autoSplit, "auto-split", true, "split partitions of point and ordered tables by themselves: by size (--split-size) or by load held over --split-qps for --split-sustain; tables may set their own (tabula table create/alter)")
	f.Uint64Var(&opts.AutoSplit.SizeBytes, "split-size", splitpolicy.DefaultSizeBytes, "split a partition once it holds this many bytes")
	f.Float64Var(&opts.AutoSplit.QPS, "split-qps", splitpolicy.DefaultQPS, "split a partition whose reads+writes per second stay at or above this for --split-sustain")
	f.DurationVar(&opts.AutoSplit.Sustain, "split-sustain", splitpolicy.DefaultSustain, "how long a partition's load must stay over --split-qps before it splits")
	f.IntVar(&opts.AutoSplit.MaxConcurrent, "max-concurrent-splits", splitpolicy.DefaultMaxConcurrent, "automatic splits in flight in the cluster at most")
	f.IntVar(&opts.AutoSplit.MaxPartitions, "max-table-partitions", splitpolicy.DefaultMaxPartitions, "automatic splits stop at this many partitions per table (a table's --max-partitions overrides it)")
	f.DurationVar(&opts.AutoSplit.Cooldown, "split-cooldown", splitpolicy.DefaultCooldown, "a split's children are not split again by load for this long (by size they are)")
	f.Uint64Var(&opts.MaxLogLag, "max-log-lag", 1_000_000, "records a replica may fall behind its partition's best before it no longer holds the log back (it copies a snapshot instead)")
	f.IntVar(&opts.MaxRequests, "max-requests", tablemaster.DefaultMaxRequests, "client calls in flight before SERVER_BUSY (servers' calls and map watches have caps of their own)")
	f.Int64Var(&opts.MaxInFlightBytes, "max-in-flight-bytes", tablemaster.DefaultMaxInFlightBytes, "bytes of client requests in flight before SERVER_BUSY")
	f.Uint64Var(&opts.RaftID, "id", 0, "this master's member id in a raft group (0: run alone)")
	f.StringVar(&peers, "peers", "", "the raft group's founding members, ID=ADDR,... (this one's included); only read on a new data directory")
	f.StringVar(&dir, "data", "./tabula-data/master", "data directory")
	f.StringVar(&metricsListen, "metrics-listen", "", metricsListenUsage)
	f.StringVar(&debug, "debug-listen", "", "address serving Go's profiling endpoints, /debug/pprof/ (default: none)")
	f.StringVar(&dashListen, "dashboard-listen", "", dashboardListenUsage+" (default: none)")
	f.DurationVar(&opts.HeartbeatInterval, "heartbeat-interval", 100*time.Millisecond, "how often servers heartbeat")
	f.DurationVar(&opts.LeaseDuration, "lease", tablemaster.DefaultLeaseDuration, "primary lease length")
	f.DurationVar(&opts.DeadAfter, "dead-after", tablemaster.DefaultDeadAfter, "silence after which a server is declared dead (must exceed --lease)")
	// Deprecated: the master no longer moves a durable partition's only
	// copy on its own (it moved them EMPTY). Accepted, and ignored, for one
	// release so existing command lines keep working.
	var reassignDurableAfter time.Duration
	f.DurationVar(&reassignDurableAfter, "reassign-durable-after", 0, "ignored")
	_ = f.MarkDeprecated("reassign-durable-after",
		"it does nothing: durable partitions on a dead server now wait for it however long it takes; "+
			"if it never returns, `tabula server forget ID --accept-data-loss` moves them (empty)")
	cmd.AddCommand(masterMembersCmd(g), masterAddCmd(g), masterRemoveCmd(g), masterTransferCmd(g))
	return cmd
}

// parsePeers parses ID=ADDR,...
func parsePeers(s string) (map[uint64]string, error) {
	out := map[uint64]string{}
	for _, p := range strings.Split(s, ",") {
		id, addr, ok := strings.Cut(strings.TrimSpace(p), "=")
		n, err := strconv.ParseUint(id, 10, 64)
		if !ok || err != nil || n == 0 || addr == "" {
			return nil, fmt.Errorf("--peers %q: want ID=ADDR,... with ids from 1 (%q is not)", s, p)
		}
		if _, dup := out[n]; dup {
			return nil, fmt.Errorf("--peers %q: member %d twice", s, n)
		}
		out[n] = addr
	}
	return out, nil
}

func masterMembersCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "members",
		Short: "List the masters of the raft group and which leads",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			resp, err := masterCallFor(ctx, g, func(mc api.MasterClient) (*api.MasterMembersResponse, error) {
				return mc.MasterMembers(ctx, &api.MasterMembersRequest{})
			})
			if err != nil {
				return fmt.Errorf("master members: %w", err)
			}
			out := cmd.OutOrStdout()
			if !resp.GetReplicated() {
				fmt.Fprintln(out, "a single master (no raft group): run masters with --id and --peers to replicate it")
				return nil
			}
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tADDR\tROLE\tRAFT VIA")
			for _, m := range resp.GetMembers() {
				role := "follower"
				switch {
				case m.GetLeader():
					role = "leader"
				case m.GetLearner():
					role = "learner"
				}
				via := m.GetRaftAddr()
				if via == "" {
					via = "-"
				}
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\n", m.GetId(), m.GetAddr(), role, via)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(out, "term %d (answered by member %d, applied index %d)\n", resp.GetTerm(), resp.GetSelf(), resp.GetApplied())
			return nil
		},
	}
}

func masterAddCmd(g *globals) *cobra.Command {
	var promote bool
	cmd := &cobra.Command{
		Use:   "add ID ADDR",
		Short: "Add a master to the raft group: a learner, promoted to voter once caught up",
		Long: "Add a master to the raft group. Start it first with --id ID (and no --peers) on an empty data\n" +
			"directory; it joins as a learner, copies the state, and with --promote (the default) becomes a\n" +
			"voter once it has caught up.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return fmt.Errorf("member id %q: want a number from 1", args[0])
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			err = g.masterCall(ctx, func(mc api.MasterClient) error {
				_, err := mc.AddMaster(ctx, &api.AddMasterRequest{Id: id, Addr: args[1], Promote: promote})
				return err
			})
			if err != nil {
				return fmt.Errorf("add master %d: %w", id, err)
			}
			state := "a learner"
			if promote {
				state = "a voter"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "master %d at %s added as %s\n", id, args[1], state)
			return nil
		},
	}
	cmd.Flags().BoolVar(&promote, "promote", true, "make it a voter once it has caught up (waits up to --timeout)")
	return cmd
}

func masterRemoveCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "remove ID",
		Short: "Remove a master from the raft group",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return fmt.Errorf("member id %q: want a number from 1", args[0])
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			err = g.masterCall(ctx, func(mc api.MasterClient) error {
				_, err := mc.RemoveMaster(ctx, &api.RemoveMasterRequest{Id: id})
				return err
			})
			if err != nil {
				return fmt.Errorf("remove master %d: %w", id, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "master %d removed\n", id)
			return nil
		},
	}
}

func masterTransferCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "transfer-leader ID",
		Short: "Make another member of the raft group lead",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return fmt.Errorf("member id %q: want a number from 1", args[0])
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			err = g.masterCall(ctx, func(mc api.MasterClient) error {
				_, err := mc.TransferLeader(ctx, &api.TransferLeaderRequest{To: id})
				return err
			})
			if err != nil {
				return fmt.Errorf("transfer leadership to %d: %w", id, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "master %d leads\n", id)
			return nil
		},
	}
}
