package main

import (
	"fmt"
	"io"
	"net"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/tableserver"

	_ "github.com/tabuladb/tabula/engines/ordered" // engines this server hosts
	_ "github.com/tabuladb/tabula/engines/point"
)

func serverCmd(g *globals) *cobra.Command {
	var (
		listen, debug, metricsListen string
		internalListen               string
		opts                         tableserver.Options
	)
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a table server",
		Long:  "Run a table server: it registers with the master, hosts the partitions it is assigned, and drains cleanly on SIGTERM.",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			serverProcs()
			log, err := g.logger()
			if err != nil {
				return err
			}
			opts.Masters, opts.Logger = g.master, log
			cred, err := g.clusterCredential(defaultClusterKeys[0], false)
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
			if err := serveDebug(debug, log); err != nil {
				return err
			}
			pm, err := startMetrics(metricsListen, log)
			if err != nil {
				return err
			}
			defer pm.Close()
			pm.server(&opts, nil)
			if ia, ok, err := internalListenAddr(listen, internalListen); err != nil {
				return err
			} else if ok {
				ilis, err := net.Listen("tcp", ia)
				if err != nil {
					return fmt.Errorf("listen on %s (--internal-listen): %w", ia, err)
				}
				defer ilis.Close()
				opts.InternalListener = ilis
				if opts.Advertise != "" {
					// The cluster reaches the internal port at the
					// advertised host.
					host, _, _ := net.SplitHostPort(opts.Advertise)
					_, port, _ := net.SplitHostPort(ilis.Addr().String())
					opts.InternalAdvertise = net.JoinHostPort(host, port)
				}
			}
			s, err := tableserver.Open(opts)
			if err != nil {
				return err
			}
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen on %s: %w (%v)", listen, err, s.Close())
			}
			internalAddr := "none (the client listener serves the cluster too)"
			if opts.InternalListener != nil {
				internalAddr = opts.InternalListener.Addr().String()
			}
			log.Info("table server listening", "addr", lis.Addr().String(), "internal", internalAddr, "data", opts.DataDir, "masters", g.master)
			go func() {
				<-cmd.Context().Done()
				if err := s.Drain(); err != nil {
					log.Error("drain", "err", err)
				}
			}()
			return s.Serve(lis)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:0", "address to serve on")
	f.StringVar(&internalListen, "internal-listen", "auto", "address of the cluster's own listener (extent replication, replica copies; the cluster credential only): auto is the --listen host on a free port, none serves the cluster on --listen too")
	f.StringVar(&debug, "debug-listen", "", "address serving Go's profiling endpoints, /debug/pprof/ (default: none)")
	f.StringVar(&metricsListen, "metrics-listen", "", metricsListenUsage)
	f.StringVar(&opts.Advertise, "advertise", "", "address clients reach this server at (default: the listen address)")
	f.StringVar(&opts.DataDir, "data", "", "data directory (required)")
	f.Int64Var(&opts.BulkCapacity, "bulk-capacity", 0, "bytes of bulk version files this server may hold loaded; a rollout places no copy where the file does not fit (0: half the machine's memory; negative: unlimited)")
	f.StringVar(&opts.FaultDomain, "fault-domain", "", "failure group (rack, host) for replica spreading: no two replicas of a partition share one (default: a domain of this server's own, server:<id>)")
	f.IntVar(&opts.MaxInFlight, "max-in-flight", 4096, "requests in flight before SERVER_BUSY")
	f.Int64Var(&opts.MaxInFlightBytes, "max-in-flight-bytes", tableserver.DefaultMaxInFlightBytes, "bytes of client requests in flight before SERVER_BUSY (replication not counted)")
	f.Uint32Var(&opts.MaxConcurrentStreams, "max-concurrent-streams", tableserver.DefaultMaxConcurrentStreams, "concurrent calls per client connection (more wait for a free one)")
	f.Float64Var(&opts.PartitionOpsPerSec, "partition-ops-limit", tableserver.DefaultPartitionOpsPerSec, "keys read and written per second in any one partition, every tenant alike, before SERVER_BUSY (negative: unlimited)")
	f.DurationVar(&opts.CoprocMaxDeadline, "coproc-max-deadline", tableserver.DefaultCoprocMaxDeadline, "cap on a coprocessor call's deadline: a longer timeout asked for is cut to it")
	f.StringVar(&opts.CoprocCacheDir, "coproc-cache", "", "directory keeping coprocessors' compiled machine code across restarts; servers may share one (default: <data>/coproc-cache)")
	f.Int64Var(&opts.RepairBandwidth, "repair-bandwidth", tableserver.DefaultRepairBandwidth, "bytes per second this server copies into new replicas, all copies together (negative: unlimited)")
	f.IntVar(&opts.ReplicateCalls, "replicate-calls", 1, "replication batches kept in flight to each other server on its stream (1 is best when the CPU is the limit; 2-4 lower write latency on servers with cores to spare)")
	f.DurationVar(&opts.ReplicateTimeout, "replicate-timeout", 150*time.Millisecond, "a replication batch to another server unanswered this long drops that server's copies from the ack sets until they catch up (the floor: the timeout follows each link's round trips)")
	f.DurationVar(&opts.ReplicateTimeoutMax, "replicate-timeout-max", 0, "cap of the adaptive replicate timeout (0: 8x --replicate-timeout; equal to it: fixed)")
	f.DurationVar(&opts.ScrubInterval, "scrub-interval", 10*time.Minute, "pause between the extent scrubber's passes over every block (negative: off)")
	f.Int64Var(&opts.ReadCacheBytes, "read-cache-bytes", tableserver.DefaultReadCacheBytes, "bytes of read cache all of this server's ssd partitions share (each an equal share)")
	f.BoolVar(&opts.EngineSyncWrites, "engine-sync-writes", false, "engines of replicated partitions fsync every write too (slower; for measuring what lazy flushing gains)")
	_ = f.MarkHidden("engine-sync-writes")
	_ = cmd.MarkFlagRequired("data")
	cmd.AddCommand(serverForgetCmd(g), serverDrainCmd(g))
	return cmd
}

// serverForgetCmd is the only way a durable partition whose only copy was
// on a dead server moves: the operator says the server is gone for good and
// accepts that those partitions start again empty.
func serverForgetCmd(g *globals) *cobra.Command {
	var accept bool
	cmd := &cobra.Command{
		Use:   "forget ID",
		Short: "Remove a dead server for good, moving its partitions (EMPTY where it held the only copy)",
		Long: "Remove a dead table server from the cluster and move every partition it still holds to live servers.\n" +
			"A durable (ssd or bulk) partition whose only copy is on that server moves EMPTY: the master refuses\n" +
			"unless --accept-data-loss is given, prints every partition lost, and `tabula table describe` keeps\n" +
			"showing them. Prefer bringing the server back: its partitions wait for it, with their data, however\n" +
			"long it is down. A forgotten server that returns later registers as a new, empty server; the data\n" +
			"it held stays on its disk under partitions/<partition id>.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			resp, err := masterCallFor(ctx, g, func(mc api.MasterClient) (*api.ForgetServerResponse, error) {
				return mc.ForgetServer(ctx, &api.ForgetServerRequest{ServerId: args[0], AcceptDataLoss: accept})
			})
			if err != nil {
				return fmt.Errorf("forget server %s: %w", args[0], err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "forgot server %s: %d partition(s) moved to live servers (map version %d)\n", args[0], resp.GetMoved(), resp.GetMapVersion())
			if len(resp.GetLost()) == 0 {
				fmt.Fprintln(out, "no data lost: every partition it held had another copy or was not durable")
				return nil
			}
			fmt.Fprintf(out, "DATA LOST: %d partition(s) had their only copy on %s and now start EMPTY:\n", len(resp.GetLost()), args[0])
			return printLost(out, resp.GetLost())
		},
	}
	cmd.Flags().BoolVar(&accept, "accept-data-loss", false, "move partitions whose only copy is on the server, EMPTY")
	return cmd
}

// printLost prints lost partitions as a table.
func printLost(out io.Writer, lost []*api.LostPartition) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TABLE\t#\tID\tLOST AT\tFROM SERVER\tAT EPOCH")
	for _, l := range lost {
		fmt.Fprintf(w, "%s/%s\t%d\t%d\t%s\t%s\t%d\n", l.GetTenant(), l.GetTable(), l.GetIndex(), l.GetPartitionId(),
			time.UnixMilli(l.GetLostUnixMs()).UTC().Format(time.RFC3339), l.GetServerId(), l.GetEpoch())
	}
	return w.Flush()
}

// internalListenAddr is where --internal-listen asks the cluster's listener
// to be: flag "auto" is listen's host on a free port, "none" (or empty) is
// no listener of its own (ok false).
func internalListenAddr(listen, flag string) (addr string, ok bool, err error) {
	switch flag {
	case "", "none":
		return "", false, nil
	case "auto":
		host, _, err := net.SplitHostPort(listen)
		if err != nil {
			return "", false, fmt.Errorf("--listen %q: %w", listen, err)
		}
		return net.JoinHostPort(host, "0"), true, nil
	}
	if _, _, err := net.SplitHostPort(flag); err != nil {
		return "", false, fmt.Errorf("--internal-listen %q: want host:port, auto or none: %w", flag, err)
	}
	return flag, true, nil
}
