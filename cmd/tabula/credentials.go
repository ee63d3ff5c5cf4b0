package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/auth"
)

// defaultClusterKeys are where `tabula dev` and `tabula master` (with
// their default --data) keep the cluster credential, so the CLI run from
// the same directory finds it.
var defaultClusterKeys = []string{"./tabula-data/cluster.key", "./tabula-data/master/cluster.key"}

// clusterKeyPath is --cluster-key if given, else $TABULA_CLUSTER_KEY, else
// def.
func (g *globals) clusterKeyPath(def string) string {
	if g.clusterKey != "" {
		return g.clusterKey
	}
	if p := os.Getenv("TABULA_CLUSTER_KEY"); p != "" {
		return p
	}
	return def
}

// credential finds what a client command signs with, first found wins:
// the command line first, then the environment, then files (as the AWS
// and Azure CLIs do):
//
//  1. --key-file FILE;
//  2. --profile NAME, from the profile file;
//  3. --cluster-key FILE;
//  4. $TABULA_TENANT with $TABULA_KEY (and $TABULA_KEY_ID, default 1);
//  5. $TABULA_PROFILE, from the profile file;
//  6. $TABULA_CLUSTER_KEY;
//  7. the profile "default" in the profile file, if there is one;
//  8. the cluster credential at --cluster-key's default, if it exists
//     (what `tabula dev` wrote in this directory).
//
// The master addresses of the profile it signs with apply too unless
// --master or $TABULA_MASTER named them (resolveMaster). With none, it
// says where it looked.
func (g *globals) credential() (client.Credential, error) {
	if g.keyFile != "" {
		return client.ReadCredentialFile(g.keyFile)
	}
	path := client.DefaultConfigPath()
	if g.profile != "" {
		return g.profileCredential(path, g.profile)
	}
	if g.clusterKey != "" {
		return client.ReadCredentialFile(g.clusterKey)
	}
	if t := os.Getenv("TABULA_TENANT"); t != "" && os.Getenv("TABULA_KEY") != "" {
		key, err := client.DecodeKey(os.Getenv("TABULA_KEY"))
		if err != nil {
			return client.Credential{}, fmt.Errorf("$TABULA_KEY: %w", err)
		}
		id := 1
		if os.Getenv("TABULA_KEY_ID") == "2" {
			id = 2
		}
		return client.TenantCredential(t, id, key), nil
	}
	if name := os.Getenv("TABULA_PROFILE"); name != "" {
		return g.profileCredential(path, name)
	}
	if p := os.Getenv("TABULA_CLUSTER_KEY"); p != "" {
		return client.ReadCredentialFile(p)
	}
	c, err := g.profileCredential(path, "default")
	if !errors.Is(err, client.ErrNoProfile) {
		return c, err
	}
	for _, p := range defaultClusterKeys {
		c, err := client.ReadCredentialFile(p)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return client.Credential{}, err
		}
	}
	return client.Credential{}, fmt.Errorf("no credential: give --key-file FILE, set $TABULA_TENANT and $TABULA_KEY, add a profile to %s (tabula tenant create NAME --save-profile), or point --cluster-key at the cluster credential (tabula dev writes <data>/cluster.key; none in %s)", path, strings.Join(defaultClusterKeys, " or "))
}

// profileCredential reads profile name from the profile file at path and
// takes its master addresses (unless --master or $TABULA_MASTER named
// them) and, for a cluster
// credential, its tenant (unless --tenant is given).
func (g *globals) profileCredential(path, name string) (client.Credential, error) {
	p, err := client.LoadProfile(path, name)
	if err != nil {
		return client.Credential{}, err
	}
	if len(p.Masters) > 0 && !g.masterSet {
		g.master = p.Masters
	}
	if p.Tenant != "" && !g.flags.Changed("tenant") && p.Credential.Principal == client.ClusterPrincipal {
		g.tenant = p.Tenant
	}
	return p.Credential, nil
}

// tenantFor is the tenant a command acts for: --tenant when given, else a
// tenant credential's own tenant, else --tenant's default.
func (g *globals) tenantFor(c client.Credential) string {
	if !g.flags.Changed("tenant") && c.Principal != "" && c.Principal != client.ClusterPrincipal {
		return c.Principal
	}
	return g.tenant
}

// clusterCredential is the credential a master or server process runs
// with: at clusterKeyPath(def). A master creates it when absent (create:
// a new cluster); a server needs it.
func (g *globals) clusterCredential(def string, create bool) (auth.Credential, error) {
	path := g.clusterKeyPath(def)
	if create {
		c, made, err := auth.LoadOrCreateClusterCredential(path)
		if err != nil {
			return auth.Credential{}, err
		}
		if made {
			fmt.Fprintf(os.Stderr, "tabula: created the cluster credential %s: servers and operators need it (--cluster-key); keep it secret\n", path)
		}
		return c, nil
	}
	c, err := auth.ReadCredentialFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return auth.Credential{}, fmt.Errorf("no cluster credential at %s: give --cluster-key with the file the master created (<its data>/cluster.key)", path)
	}
	if err == nil && c.Principal != auth.ClusterPrincipal {
		return auth.Credential{}, fmt.Errorf("%s is tenant %q's credential, not the cluster's", path, c.Principal)
	}
	return c, err
}
