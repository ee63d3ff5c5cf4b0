package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// The dev banner tells the truth off the defaults (issue 32, item 7):
// how the CLI comes to sign with the dev cluster's credential, or what to
// give it; and the connection string that reaches the Azure gateway.
func TestDevCredentialHint(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	other, err := filepath.Abs("elsewhere/cluster.key")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name           string
		path           string
		getenv         func(string) string
		defaultProfile bool
		want, not      []string
	}{
		{"the default --data", "./tabula-data/cluster.key", env(), false,
			[]string{"the CLI run in this directory finds it"}, nil},
		{"another --data", "elsewhere/cluster.key", env(), false,
			[]string{"does not look there", "--cluster-key " + other, "TABULA_CLUSTER_KEY=" + other}, []string{"finds it"}},
		{"$TABULA_CLUSTER_KEY names it", "elsewhere/cluster.key", env("TABULA_CLUSTER_KEY", other), false,
			[]string{"through $TABULA_CLUSTER_KEY"}, nil},
		{"$TABULA_CLUSTER_KEY names another", "./tabula-data/cluster.key", env("TABULA_CLUSTER_KEY", other), false,
			[]string{"signs with $TABULA_CLUSTER_KEY " + other + " instead"}, []string{"finds it"}},
		{"a default profile comes first", "./tabula-data/cluster.key", env(), true,
			[]string{`your profile "default"`, "instead", "--cluster-key"}, []string{"finds it"}},
		{"$TABULA_PROFILE", "./tabula-data/cluster.key", env("TABULA_PROFILE", "acme"), false,
			[]string{"$TABULA_PROFILE acme instead"}, nil},
		{"a tenant in the environment", "./tabula-data/cluster.key", env("TABULA_TENANT", "acme", "TABULA_KEY", "x"), false,
			[]string{"$TABULA_TENANT acme instead"}, nil},
	} {
		got := devCredentialHint(c.path, c.getenv, c.defaultProfile)
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q does not say %q", c.name, got, w)
			}
		}
		for _, w := range c.not {
			if strings.Contains(got, w) {
				t.Errorf("%s: %q says %q", c.name, got, w)
			}
		}
	}
}

func TestDevAzureLine(t *testing.T) {
	const key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
	for _, c := range []struct{ addr, want string }{
		{"127.0.0.1:10002", "http://127.0.0.1:10002/devstoreaccount1  (Azure Table REST; account devstoreaccount1 with its well-known key; connection string: UseDevelopmentStorage=true)"},
		{"127.0.0.1:10012", "connection string: DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=" + key + ";TableEndpoint=http://127.0.0.1:10012/devstoreaccount1;)"},
		{"[::]:10002", "http://127.0.0.1:10002/devstoreaccount1  (Azure Table REST; account devstoreaccount1 with its well-known key; connection string: UseDevelopmentStorage=true)"},
		{"10.1.2.3:10002", "TableEndpoint=http://10.1.2.3:10002/devstoreaccount1;"},
	} {
		if got := devAzureLine(c.addr); !strings.Contains(got, c.want) {
			t.Errorf("devAzureLine(%s) = %q, want it to hold %q", c.addr, got, c.want)
		}
	}
	if got := devMasterHint([]string{defaultMaster}, func(string) string { return "" }); got != "" {
		t.Errorf("the default master got a hint: %q", got)
	}
	if got := devMasterHint([]string{"127.0.0.1:7300"}, func(string) string { return "" }); !strings.Contains(got, "TABULA_MASTER=127.0.0.1:7300") {
		t.Errorf("another master's hint: %q", got)
	}
}
