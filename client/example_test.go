package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/testcluster"
)

// exampleCluster starts an in-process cluster and a client of it. A real
// program passes its masters' addresses to client.New instead.
func exampleCluster(ctx context.Context) (*client.Client, func()) {
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 3})
	if err != nil {
		panic(err)
	}
	c, err := client.New(ctx, client.Options{Masters: []string{tc.MasterAddr()}, Credential: tc.Credential()})
	if err != nil {
		panic(err)
	}
	return c, func() {
		c.Close()
		tc.Close()
	}
}

// exampleProfile starts an in-process cluster, creates tenant in it and
// saves the tenant's profile (key 1 and the master's address) in a fresh
// profile file, as `tabula tenant create NAME --save-profile` does; it
// returns the file's path.
func exampleProfile(ctx context.Context, tenant string) (string, func()) {
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 1})
	if err != nil {
		panic(err)
	}
	dir, err := os.MkdirTemp("", "tabula-example-*")
	if err != nil {
		panic(err)
	}
	stop := func() {
		tc.Close()
		os.RemoveAll(dir)
	}
	path, err := saveTenantProfile(ctx, tc, dir, tenant)
	if err != nil {
		stop()
		panic(err)
	}
	return path, stop
}

// saveTenantProfile creates tenant in tc and saves its profile in dir.
func saveTenantProfile(ctx context.Context, tc *testcluster.Cluster, dir, tenant string) (string, error) {
	admin, err := client.New(ctx, client.Options{Masters: tc.MasterAddrs(), Credential: tc.Credential()})
	if err != nil {
		return "", err
	}
	defer admin.Close()
	info, err := admin.CreateTenant(ctx, tenant, nil)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "config")
	return path, client.SaveProfile(path, tenant, client.Profile{
		Masters: tc.MasterAddrs(), Tenant: tenant, Credential: client.TenantCredential(tenant, 1, info.GetKeys()[0]),
	})
}

// A program signs as a tenant with the profile the CLI saved for it.
func ExampleLoadProfile() {
	ctx := context.Background()
	path, stop := exampleProfile(ctx, "acme") // a real program: client.DefaultConfigPath()
	defer stop()

	p, err := client.LoadProfile(path, "acme")
	if err != nil {
		fmt.Println(err)
		return
	}
	c, err := client.New(ctx, client.Options{Masters: p.Masters, Credential: p.Credential})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	fmt.Println("tenant:", c.Tenant())

	// Create if absent.
	for range 2 {
		_, err = c.CreateTable(ctx, "users", client.PointTable, nil)
		if err != nil && !errors.Is(err, client.ErrAlreadyExists) {
			fmt.Println(err)
			return
		}
	}
	fmt.Println("created twice:", errors.Is(err, client.ErrAlreadyExists), api.CodeOf(err))
	users := c.Table("users")
	if err := users.Put(ctx, []byte("alice"), []byte("pro")); err != nil {
		fmt.Println(err)
		return
	}
	v, err := users.Get(ctx, []byte("alice"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("alice: %s\n", v)

	// Without a credential the cluster refuses.
	anon, err := client.New(ctx, client.Options{Masters: p.Masters})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer anon.Close()
	_, err = anon.Table("users").Get(ctx, []byte("alice"))
	fmt.Println("unsigned:", api.CodeOf(err))
	// Output:
	// tenant: acme
	// created twice: true ERROR_CODE_ALREADY_EXISTS
	// alice: pro
	// unsigned: ERROR_CODE_UNAUTHENTICATED
}

func Example() {
	ctx := context.Background()
	c, stop := exampleCluster(ctx)
	defer stop()

	if _, err := c.CreateTable(ctx, "users", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 12}); err != nil {
		fmt.Println(err)
		return
	}
	users := c.Table("users")
	if err := users.Put(ctx, []byte("ada"), []byte("lovelace"), client.WithTTL(time.Hour)); err != nil {
		fmt.Println(err)
		return
	}
	v, err := users.Get(ctx, []byte("ada"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("ada: %s\n", v)

	_, err = users.Get(ctx, []byte("grace"))
	fmt.Println("grace found:", !errors.Is(err, client.ErrKeyNotFound))

	_, err = c.Table("nosuchtable").Get(ctx, []byte("ada"))
	fmt.Println("unknown table:", api.CodeOf(err))
	// Output:
	// ada: lovelace
	// grace found: false
	// unknown table: ERROR_CODE_NOT_FOUND
}

func ExampleTable_CompareAndSwap() {
	ctx := context.Background()
	c, stop := exampleCluster(ctx)
	defer stop()
	if _, err := c.CreateTable(ctx, "locks", api.TableKind_TABLE_KIND_POINT, nil); err != nil {
		fmt.Println(err)
		return
	}
	locks := c.Table("locks")

	// Take the lock only if nobody holds it.
	r, err := locks.CompareAndSwap(ctx, client.CAS{Key: []byte("job-7"), ExpectAbsent: true, Value: []byte("worker-a")})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("worker-a got it:", r.Swapped)

	r, err = locks.CompareAndSwap(ctx, client.CAS{Key: []byte("job-7"), ExpectAbsent: true, Value: []byte("worker-b")})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("worker-b got it: %v (held by %s)\n", r.Swapped, r.Current)

	// Release it only if we still hold it.
	r, err = locks.CompareAndSwap(ctx, client.CAS{Key: []byte("job-7"), Expected: []byte("worker-a"), Delete: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("released:", r.Swapped)
	// Output:
	// worker-a got it: true
	// worker-b got it: false (held by worker-a)
	// released: true
}

func ExampleTable_BatchWrite() {
	ctx := context.Background()
	c, stop := exampleCluster(ctx)
	defer stop()
	if _, err := c.CreateTable(ctx, "scores", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 4}); err != nil {
		fmt.Println(err)
		return
	}
	scores := c.Table("scores")

	// One request per partition, in parallel; atomic within each partition.
	err := scores.BatchWrite(ctx, []client.Mutation{
		{Key: []byte("alice"), Value: []byte("10")},
		{Key: []byte("bob"), Value: []byte("7")},
		{Key: []byte("carol"), Value: []byte("12")},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := scores.BatchGet(ctx, [][]byte{[]byte("carol"), []byte("dave"), []byte("alice")})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range res {
		fmt.Printf("found=%v value=%q\n", r.Found, r.Value)
	}

	n := 0
	if err := scores.Scan(ctx, func(key, value []byte) error { n++; return nil }); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("records:", n)
	// Output:
	// found=true value="12"
	// found=false value=""
	// found=true value="10"
	// records: 3
}
