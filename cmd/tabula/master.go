package main

import (
	"fmt"
	"net"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/tablemaster"
)

func masterCmd(g *globals) *cobra.Command {
	var (
		listen string
		dir    string
		opts   tablemaster.Options
	)
	cmd := &cobra.Command{
		Use:   "master",
		Short: "Run the Table Master",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			opts.DataDir, opts.Logger = dir, log
			m, err := tablemaster.Open(opts)
			if err != nil {
				return err
			}
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen on %s: %w (%v)", listen, err, m.Close())
			}
			log.Info("master serving", "addr", lis.Addr().String(), "data", dir)
			go func() {
				<-cmd.Context().Done()
				log.Info("master shutting down")
				_ = m.Close()
			}()
			return m.Serve(lis)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", defaultMaster, "address to serve on")
	f.StringVar(&dir, "data", "./tabula-data/master", "data directory")
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
	return cmd
}
