package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tabuladb/tabula/api"
)

// quotaFlags are the flags that set a tenant's quotas (tenant create,
// tenant quota). Sizes take a unit (10GiB, 512MB); 0 is no limit.
type quotaFlags struct {
	stored, memory                string
	readOps, writeOps, coprocCPUs uint64
}

func (q *quotaFlags) register(f *pflag.FlagSet) {
	f.StringVar(&q.stored, "stored-bytes", "", "quota of keys and values stored, e.g. 100GiB (0: no limit)")
	f.StringVar(&q.memory, "memory-bytes", "", "quota of bytes held in memory: memory tables and bulk indexes, e.g. 2GiB (0: no limit)")
	f.Uint64Var(&q.readOps, "read-ops", 0, "quota of keys read per second, over every server (0: no limit)")
	f.Uint64Var(&q.writeOps, "write-ops", 0, "quota of keys written per second, over every server (0: no limit)")
	f.Uint64Var(&q.coprocCPUs, "coproc-cpu-ms", 0, "quota of coprocessor CPU milliseconds per second, over every server (0: no limit)")
}

// changed reports whether any quota flag was given.
func (q *quotaFlags) changed(f *pflag.FlagSet) bool {
	for _, n := range []string{"stored-bytes", "memory-bytes", "read-ops", "write-ops", "coproc-cpu-ms"} {
		if f.Changed(n) {
			return true
		}
	}
	return false
}

// quota builds the quota: fields whose flag was not given keep base's.
func (q *quotaFlags) quota(f *pflag.FlagSet, base *api.TenantQuota) (*api.TenantQuota, error) {
	out := &api.TenantQuota{}
	if base != nil {
		out.StoredBytes, out.MemoryBytes = base.StoredBytes, base.MemoryBytes
		out.ReadOpsPerSec, out.WriteOpsPerSec, out.CoprocCpuMsPerSec = base.ReadOpsPerSec, base.WriteOpsPerSec, base.CoprocCpuMsPerSec
	}
	var err error
	if f.Changed("stored-bytes") {
		if out.StoredBytes, err = parseBytes(q.stored); err != nil {
			return nil, fmt.Errorf("--stored-bytes: %w", err)
		}
	}
	if f.Changed("memory-bytes") {
		if out.MemoryBytes, err = parseBytes(q.memory); err != nil {
			return nil, fmt.Errorf("--memory-bytes: %w", err)
		}
	}
	if f.Changed("read-ops") {
		out.ReadOpsPerSec = q.readOps
	}
	if f.Changed("write-ops") {
		out.WriteOpsPerSec = q.writeOps
	}
	if f.Changed("coproc-cpu-ms") {
		out.CoprocCpuMsPerSec = q.coprocCPUs
	}
	return out, nil
}

// parseBytes reads a byte count with an optional unit: B, KB/MB/GB/TB
// (powers of 1000) or KiB/MiB/GiB/TiB (powers of 1024).
func parseBytes(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   uint64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
	mult := uint64(1)
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseFloat(t, 64)
	if err != nil || !(n >= 0 && n*float64(mult) < 1<<63) { // NaN fails too
		return 0, fmt.Errorf("%q is not a byte count (e.g. 512MiB, 10GB, 1048576)", s)
	}
	return uint64(n * float64(mult)), nil
}

// printQuota prints each quota against its usage.
func printQuota(out io.Writer, q *api.TenantQuota, u *api.TenantUsage) {
	limit := func(n uint64, f func(uint64) string) string {
		if n == 0 {
			return "no limit"
		}
		return f(n)
	}
	num := func(n uint64) string { return strconv.FormatUint(n, 10) + "/s" }
	rate := func(f float64) string { return strconv.FormatFloat(f, 'f', 0, 64) + "/s" }
	if u == nil {
		fmt.Fprintln(out, "usage    not known here (ask the leading master; it learns usage from heartbeats)")
		u = &api.TenantUsage{}
	}
	fmt.Fprintln(out, "quota            used          limit")
	fmt.Fprintf(out, "  stored bytes   %-13s %s\n", humanBytes(u.GetStoredBytes()), limit(q.GetStoredBytes(), humanBytes))
	fmt.Fprintf(out, "  memory bytes   %-13s %s\n", humanBytes(u.GetMemoryBytes()), limit(q.GetMemoryBytes(), humanBytes))
	fmt.Fprintf(out, "  reads          %-13s %s\n", rate(u.GetReadOpsPerSec()), limit(q.GetReadOpsPerSec(), num))
	fmt.Fprintf(out, "  writes         %-13s %s\n", rate(u.GetWriteOpsPerSec()), limit(q.GetWriteOpsPerSec(), num))
	fmt.Fprintf(out, "  coproc cpu ms  %-13s %s\n", rate(u.GetCoprocCpuMsPerSec()), limit(q.GetCoprocCpuMsPerSec(), num))
	if u.GetThrottledPerSec() > 0 || u.GetQuotaRefusedPerSec() > 0 {
		fmt.Fprintf(out, "refused  %s throttled (SERVER_BUSY), %s over a size (QUOTA_EXCEEDED)\n", rate(u.GetThrottledPerSec()), rate(u.GetQuotaRefusedPerSec()))
	}
}

func tenantQuotaCmd(g *globals) *cobra.Command {
	var qf quotaFlags
	cmd := &cobra.Command{
		Use:   "quota NAME [--stored-bytes N] [--memory-bytes N] [--read-ops N] [--write-ops N] [--coproc-cpu-ms N]",
		Short: "Show or change a tenant's quotas (flags not given keep their value; 0 removes a limit)",
		Long: `Rates are summed over every server: each server gets a share in proportion to the
tenant's demand there, and a request over it is answered SERVER_BUSY with a
retry-after (the SDK backs off). A write over a size quota is refused
QUOTA_EXCEEDED and changes nothing; deletes always pass.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			var t *api.TenantInfo
			err := g.masterCall(ctx, func(mc api.MasterClient) error {
				resp, err := mc.DescribeTenant(ctx, &api.DescribeTenantRequest{Tenant: args[0]})
				if err != nil {
					return err
				}
				t = resp.GetTenant()
				if !qf.changed(cmd.Flags()) {
					return nil
				}
				q, err := qf.quota(cmd.Flags(), t.GetQuota())
				if err != nil {
					return err
				}
				sr, err := mc.SetTenantQuota(ctx, &api.SetTenantQuotaRequest{Tenant: args[0], Quota: q})
				if err != nil {
					return err
				}
				t = sr.GetTenant()
				return nil
			})
			if err != nil {
				return fmt.Errorf("quota of tenant %s: %w", args[0], err)
			}
			printQuota(cmd.OutOrStdout(), t.GetQuota(), t.GetUsage())
			return nil
		},
	}
	qf.register(cmd.Flags())
	return cmd
}
