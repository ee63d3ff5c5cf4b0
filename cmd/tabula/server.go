package main

import (
	"fmt"
	"net"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/tableserver"

	_ "github.com/tabuladb/tabula/engines/point" // engines this server hosts
)

func serverCmd(g *globals) *cobra.Command {
	var (
		listen string
		opts   tableserver.Options
	)
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a table server",
		Long:  "Run a table server: it registers with the master, hosts the partitions it is assigned, and drains cleanly on SIGTERM.",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			opts.Masters, opts.Logger = g.master, log
			s, err := tableserver.Open(opts)
			if err != nil {
				return err
			}
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen on %s: %w (%v)", listen, err, s.Close())
			}
			log.Info("table server listening", "addr", lis.Addr().String(), "data", opts.DataDir, "masters", g.master)
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
	f.StringVar(&opts.Advertise, "advertise", "", "address clients reach this server at (default: the listen address)")
	f.StringVar(&opts.DataDir, "data", "", "data directory (required)")
	f.StringVar(&opts.FaultDomain, "fault-domain", "", "failure group (rack, host) for replica spreading: no two replicas of a partition share one (default: a domain of this server's own, server:<id>)")
	f.IntVar(&opts.MaxInFlight, "max-in-flight", 4096, "requests in flight before SERVER_BUSY")
	f.StringVar(&opts.CoprocCacheDir, "coproc-cache", "", "directory keeping coprocessors' compiled machine code across restarts; servers may share one (default: <data>/coproc-cache)")
	f.DurationVar(&opts.ScrubInterval, "scrub-interval", 10*time.Minute, "pause between the extent scrubber's passes over every block (negative: off)")
	_ = cmd.MarkFlagRequired("data")
	return cmd
}
