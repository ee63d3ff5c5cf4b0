package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/replication/stream"
)

func streamCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "stream", Short: "Inspect and use streams of the stream layer (replicated append-only extents)"}
	cmd.AddCommand(
		&cobra.Command{
			Use: "ls", Short: "List streams", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				ctx, cancel := g.withTimeout(cmd.Context())
				defer cancel()
				c, err := g.client(ctx)
				if err != nil {
					return err
				}
				defer c.Close()
				list, err := c.Streams().List(ctx)
				if err != nil {
					return err
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "NAME\tEXTENTS\tSEALED\tSEALED BYTES")
				for _, s := range list {
					fmt.Fprintf(w, "%s\t%d\t%d\t%d\n", s.Name, s.Extents, s.Sealed, s.SealedBytes)
				}
				return w.Flush()
			},
		},
		streamCreateCmd(g),
		&cobra.Command{
			Use: "rm NAME", Short: "Delete a stream (its unreferenced extents are garbage-collected)", Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				ctx, cancel := g.withTimeout(cmd.Context())
				defer cancel()
				c, err := g.client(ctx)
				if err != nil {
					return err
				}
				defer c.Close()
				return c.Streams().Delete(ctx, args[0])
			},
		},
		&cobra.Command{
			Use: "stat NAME", Short: "Show a stream's extents: replicas, seal state, health", Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				ctx, cancel := g.withTimeout(cmd.Context())
				defer cancel()
				c, err := g.client(ctx)
				if err != nil {
					return err
				}
				defer c.Close()
				info, err := c.Streams().Stream(ctx, args[0])
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				fmt.Fprintf(out, "stream %s: %d extents, writer epoch %d\n", info.Name, len(info.Extents), info.Epoch)
				w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "EXTENT\tSTATE\tLENGTH\tLAST SEQ\tREPLICAS")
				for _, e := range info.Extents {
					fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\n", e.ID, sealState(e), lengthOf(e), e.LastSeq, replicasOf(e))
				}
				return w.Flush()
			},
		},
		streamAppendCmd(g),
		streamCatCmd(g),
	)
	return cmd
}

func streamCreateCmd(g *globals) *cobra.Command {
	var code string
	cmd := &cobra.Command{
		Use: "create NAME [--code lrc-12-2-2]", Short: "Create an empty stream", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			if _, err := c.Streams().Create(ctx, args[0], code); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "created stream %s\n", args[0])
			return nil
		},
	}
	cmd.Flags().StringVar(&code, "code", "", "erasure-code sealed extents: "+stream.CodeLRC12+" (default: keep 3 replicas)")
	return cmd
}

func sealState(e stream.ExtentPlacement) string {
	if e.Coding != nil {
		if e.Coding.Coded {
			return "sealed, coded " + e.Coding.Scheme
		}
		return "sealed, coding " + e.Coding.Scheme
	}
	if e.Sealed {
		return "sealed"
	}
	return "open"
}

func lengthOf(e stream.ExtentPlacement) string {
	if e.Sealed {
		return strconv.FormatInt(e.Length, 10)
	}
	return "-"
}

func replicasOf(e stream.ExtentPlacement) string {
	var parts []string
	for _, r := range e.Replicas {
		s := r.Node
		if !r.OK {
			s += "(not ok)"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ",")
}

func streamAppendCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "append NAME [DATA|-]",
		Short: "Append one record (DATA, or stdin with -) to a stream",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			data := []byte(args[1])
			if args[1] == "-" {
				var err error
				if data, err = io.ReadAll(cmd.InOrStdin()); err != nil {
					return err
				}
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			sc := stream.NewClient(c.Streams(), stream.ClientOptions{Conns: c.StreamConns()})
			defer sc.Close()
			res, err := sc.Append(ctx, args[0], data)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "appended seq %d at extent %d offset %d length %d\n", res.Seq, res.Location.Extent, res.Location.Offset, res.Location.Length)
			return nil
		},
	}
}

func streamCatCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cat NAME",
		Short: "Print every record of a stream, one per line (duplicates from retried appends dropped)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			sc := stream.NewClient(c.Streams(), stream.ClientOptions{Conns: c.StreamConns()})
			defer sc.Close()
			out := cmd.OutOrStdout()
			return sc.ReadStream(ctx, args[0], func(e stream.Entry) error {
				for _, b := range e.Blocks {
					if _, err := out.Write(append(b, '\n')); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
}

func extentCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "extent", Short: "Inspect extents of the stream layer"}
	cmd.AddCommand(&cobra.Command{
		Use: "stat ID", Short: "Show an extent's replicas, seal state and health", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return errors.New("extent ID must be a positive number (tabula stream stat lists them)")
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := c.Streams().ExtentStat(ctx, id)
			if err != nil {
				return err
			}
			nodes, err := c.Streams().Nodes(ctx)
			if err != nil {
				return err
			}
			fd := map[string]string{}
			alive := map[string]bool{}
			for _, n := range nodes {
				fd[n.ID], alive[n.ID] = n.FaultDomain, n.Alive
			}
			out := cmd.OutOrStdout()
			p, m := st.Placement, st.Meta
			fmt.Fprintf(out, "extent %d: %s, length %s, last seq %d, primary %s\n", p.ID, sealState(p), lengthOf(p), p.LastSeq, m.Primary)
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NODE\tADDR\tFAULT DOMAIN\tNODE ALIVE\tREPLICA STATE")
			states := map[string]string{}
			for _, r := range m.Replicas {
				states[r.Node] = string(r.State)
			}
			for _, r := range p.Replicas {
				fmt.Fprintf(w, "%s\t%s\t%s\t%v\t%s\n", r.Node, r.Addr, fd[r.Node], alive[r.Node], states[r.Node])
			}
			if err := w.Flush(); err != nil {
				return err
			}
			if cd := p.Coding; cd != nil {
				fmt.Fprintf(out, "\ncoding %s: %s; fragment size %d\n", cd.Scheme, cd.Spread(), cd.FragmentSize)
				w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "FRAGMENT\tNODE\tFAULT DOMAIN\tOK\tCRC32C")
				for _, f := range cd.Fragments {
					fmt.Fprintf(w, "%d\t%s\t%s\t%v\t%08x\n", f.Index, f.Node, f.FaultDomain, f.OK, f.CRC)
				}
				return w.Flush()
			}
			return nil
		},
	})
	return cmd
}
