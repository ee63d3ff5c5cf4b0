package main

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

func tenantCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tenant",
		Short: "Manage tenants, their keys and quotas (needs the cluster credential)",
		Long: `A tenant owns tables and has two 512-bit keys; requests signed with either act for
the tenant and only for it. Rotate one key while clients use the other. Creating,
listing, deleting and rekeying tenants needs the cluster credential; a tenant may
describe itself.`,
	}
	cmd.AddCommand(tenantCreateCmd(g), tenantListCmd(g), tenantDescribeCmd(g), tenantDeleteCmd(g), tenantKeysCmd(g), tenantQuotaCmd(g))
	return cmd
}

// printKeys prints a tenant's keys and how to use them.
func printKeys(g *globals, cmd *cobra.Command, t *api.TenantInfo) {
	out := cmd.OutOrStdout()
	for i, k := range t.GetKeys() {
		fmt.Fprintf(out, "key %d  %s\n", i+1, client.EncodeKey(k))
	}
}

func tenantCreateCmd(g *globals) *cobra.Command {
	var save bool
	var profile string
	var keyFlags []string
	var qf quotaFlags
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a tenant with two fresh keys and print them",
		Long: `Create a tenant with two fresh keys and print them. --key gives key 1 (and, a second
time, key 2) instead: for an account whose key is already known, such as the Azure
storage emulator's devstoreaccount1. A key is 64 bytes in base64 (standard or URL-safe,
padded or not); a key not given is generated.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			q, err := qf.quota(cmd.Flags(), nil)
			if err != nil {
				return err
			}
			if len(keyFlags) > 2 {
				return fmt.Errorf("create tenant %s: %d --key flags; a tenant has 2 keys", args[0], len(keyFlags))
			}
			var keys [][]byte
			for i, s := range keyFlags {
				k, err := client.DecodeKey(s)
				if err != nil {
					return fmt.Errorf("create tenant %s: --key %d: %w", args[0], i+1, err)
				}
				keys = append(keys, k)
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			resp, err := masterCallFor(ctx, g, func(mc api.MasterClient) (*api.CreateTenantResponse, error) {
				return mc.CreateTenant(ctx, &api.CreateTenantRequest{Tenant: args[0], Quota: q, Keys: keys})
			})
			if err != nil {
				return fmt.Errorf("create tenant %s: %w", args[0], err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "tenant %s created\n", args[0])
			printKeys(g, cmd, resp.GetTenant())
			if !save {
				fmt.Fprintf(out, "use: TABULA_TENANT=%s TABULA_KEY=<key 1> tabula ..., or run again with --save-profile\n", args[0])
				return nil
			}
			if profile == "" {
				profile = args[0]
			}
			path := client.DefaultConfigPath()
			p := client.Profile{Masters: g.master, Tenant: args[0], Credential: client.TenantCredential(args[0], 1, resp.GetTenant().GetKeys()[0])}
			if err := client.SaveProfile(path, profile, p); err != nil {
				return err
			}
			fmt.Fprintf(out, "saved key 1 as profile %q in %s: tabula --profile %s ...\n", profile, path, profile)
			return nil
		},
	}
	cmd.Flags().BoolVar(&save, "save-profile", false, "save key 1 and --master as a profile in the profile file")
	cmd.Flags().StringVar(&profile, "profile-name", "", "name of the saved profile (default: the tenant's)")
	cmd.Flags().StringArrayVar(&keyFlags, "key", nil, "use this base64 key as key 1 (a second --key: key 2) instead of a fresh one")
	qf.register(cmd.Flags())
	return cmd
}

func tenantListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List tenants",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			resp, err := masterCallFor(ctx, g, func(mc api.MasterClient) (*api.ListTenantsResponse, error) {
				return mc.ListTenants(ctx, &api.ListTenantsRequest{})
			})
			if err != nil {
				return fmt.Errorf("list tenants: %w", err)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "TENANT\tTABLES\tCREATED")
			for _, t := range resp.GetTenants() {
				fmt.Fprintf(w, "%s\t%d\t%s\n", t.GetName(), t.GetTables(), time.UnixMilli(t.GetCreatedUnixMs()).UTC().Format(time.RFC3339))
			}
			return w.Flush()
		},
	}
}

func tenantDescribeCmd(g *globals) *cobra.Command {
	var showKeys bool
	cmd := &cobra.Command{
		Use:   "describe NAME",
		Short: "Show a tenant and its tables",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			resp, err := masterCallFor(ctx, g, func(mc api.MasterClient) (*api.DescribeTenantResponse, error) {
				return mc.DescribeTenant(ctx, &api.DescribeTenantRequest{Tenant: args[0]})
			})
			if err != nil {
				return fmt.Errorf("describe tenant %s: %w", args[0], err)
			}
			out := cmd.OutOrStdout()
			t := resp.GetTenant()
			fmt.Fprintf(out, "tenant   %s\ncreated  %s\ntables   %d\n", t.GetName(), time.UnixMilli(t.GetCreatedUnixMs()).UTC().Format(time.RFC3339), t.GetTables())
			for _, tb := range resp.GetTables() {
				fmt.Fprintf(out, "  %s  %s  %d partitions\n", tb.GetName(), strings.ToLower(strings.TrimPrefix(tb.GetKind().String(), "TABLE_KIND_")), tb.GetOptions().GetPartitions())
			}
			printQuota(out, t.GetQuota(), t.GetUsage())
			if showKeys {
				if len(t.GetKeys()) == 0 {
					fmt.Fprintln(out, "keys     only shown to the cluster credential")
				}
				printKeys(g, cmd, t)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&showKeys, "show-keys", false, "print the tenant's keys (cluster credential only)")
	return cmd
}

func tenantDeleteCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a tenant that has no tables",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			err := g.masterCall(ctx, func(mc api.MasterClient) error {
				_, err := mc.DeleteTenant(ctx, &api.DeleteTenantRequest{Tenant: args[0]})
				return err
			})
			if err != nil {
				return fmt.Errorf("delete tenant %s: %w", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "tenant %s deleted\n", args[0])
			return nil
		},
	}
}

func tenantKeysCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "keys", Short: "Manage a tenant's keys"}
	var key int
	var saveProfile string
	rotate := &cobra.Command{
		Use:   "rotate TENANT --key 1|2 [--save-profile [PROFILE]]",
		Short: "Replace one of a tenant's keys with a fresh one (the other keeps working)",
		Long: `Replace one of a tenant's keys with a fresh one and print the keys; requests signed with
the old one are refused once the servers learn it (within a heartbeat), those signed with
the other key keep working. --save-profile saves the new key in a profile (default: the
tenant's name), replacing the one a profile used, so the profile keeps working; the
profile keeps its master addresses unless --master or $TABULA_MASTER is given.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if key != 1 && key != 2 {
				return fmt.Errorf("--key %d: a tenant has key 1 and key 2", key)
			}
			tenant := args[0]
			save := cmd.Flags().Changed("save-profile")
			if len(args) == 2 {
				// `--save-profile NAME`: a flag with an optional value
				// takes NAME as an argument.
				if !save || saveProfile != saveProfileDefault {
					return fmt.Errorf("rotate takes one tenant; got %q too (a profile name goes with --save-profile)", args[1])
				}
				saveProfile = args[1]
			}
			if saveProfile == saveProfileDefault {
				saveProfile = tenant
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			resp, err := masterCallFor(ctx, g, func(mc api.MasterClient) (*api.RotateTenantKeyResponse, error) {
				return mc.RotateTenantKey(ctx, &api.RotateTenantKeyRequest{Tenant: tenant, Key: uint32(key)})
			})
			if err != nil {
				return fmt.Errorf("rotate key %d of tenant %s: %w", key, tenant, err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "key %s of tenant %s replaced; requests signed with the old one are refused once servers learn it (within a heartbeat)\n", strconv.Itoa(key), tenant)
			printKeys(g, cmd, resp.GetTenant())
			if !save {
				return nil
			}
			keys := resp.GetTenant().GetKeys()
			if len(keys) < key {
				return fmt.Errorf("rotate key %d of tenant %s: the master's answer holds %d keys; nothing saved", key, tenant, len(keys))
			}
			path := client.DefaultConfigPath()
			p := client.Profile{Masters: g.master, Tenant: tenant, Credential: client.TenantCredential(tenant, key, keys[key-1])}
			if old, err := client.LoadProfile(path, saveProfile); err == nil && len(old.Masters) > 0 && !g.masterSet {
				p.Masters = old.Masters // the profile's cluster, not this command's default
			}
			if err := client.SaveProfile(path, saveProfile, p); err != nil {
				return fmt.Errorf("key %d of tenant %s was replaced, but saving it: %w", key, tenant, err)
			}
			fmt.Fprintf(out, "saved key %d as profile %q in %s: tabula --profile %s ...\n", key, saveProfile, path, saveProfile)
			return nil
		},
	}
	rotate.Flags().IntVar(&key, "key", 0, "which key to replace: 1 or 2")
	rotate.Flags().StringVar(&saveProfile, "save-profile", "", "save the new key (and the masters) as profile `PROFILE` in the profile file (without a name: the tenant's)")
	rotate.Flags().Lookup("save-profile").NoOptDefVal = saveProfileDefault
	_ = rotate.MarkFlagRequired("key")
	cmd.AddCommand(rotate)
	return cmd
}

// saveProfileDefault is --save-profile given without a name.
const saveProfileDefault = "TENANT"
