package compat

import (
	"net/http"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/data/aztables"
)

// TestAccessPolicy: SetAccessPolicy stores a table's policies and
// GetAccessPolicy reads them back; a SAS naming a policy (si) takes its
// permissions and times from it; more than five policies are refused;
// removing the policy revokes the SAS.
func TestAccessPolicy(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c, name := newNamedTable(t)
	add(t, c, ent("p", "r", nil))
	now := time.Now().UTC().Truncate(time.Second)
	policy := &aztables.SignedIdentifier{ID: to.Ptr("readers"), AccessPolicy: &aztables.AccessPolicy{
		Start: to.Ptr(now.Add(-time.Hour)), Expiry: to.Ptr(now.Add(time.Hour)), Permission: to.Ptr("r")}}
	if _, err := c.SetAccessPolicy(ctx, &aztables.SetAccessPolicyOptions{TableACL: []*aztables.SignedIdentifier{policy}}); err != nil {
		t.Fatalf("set access policy: %v", err)
	}
	got, err := c.GetAccessPolicy(ctx, nil)
	if err != nil {
		t.Fatalf("get access policy: %v", err)
	}
	if len(got.SignedIdentifiers) != 1 || *got.SignedIdentifiers[0].ID != "readers" ||
		*got.SignedIdentifiers[0].AccessPolicy.Permission != "r" || !got.SignedIdentifiers[0].AccessPolicy.Expiry.Equal(now.Add(time.Hour)) {
		t.Fatalf("access policy read back: %+v", got.SignedIdentifiers)
	}

	sas, err := aztables.SASSignatureValues{Identifier: "readers", TableName: name}.Sign(target.cred)
	if err != nil {
		t.Fatal(err)
	}
	ro, err := aztables.NewClientWithNoCredential(target.endpoint+"/"+name+"?"+sas, clientOpts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ro.GetEntity(ctx, "p", "r", nil); err != nil {
		t.Fatalf("read through the policy's SAS: %v", err)
	}
	_, err = ro.AddEntity(ctx, marshal(t, ent("p", "r2", nil)), nil)
	wantErr(t, err, http.StatusForbidden, "AuthorizationPermissionMismatch")

	six := make([]*aztables.SignedIdentifier, 6)
	for i := range six {
		six[i] = &aztables.SignedIdentifier{ID: to.Ptr(string(rune('a' + i))), AccessPolicy: policy.AccessPolicy}
	}
	if _, err := c.SetAccessPolicy(ctx, &aztables.SetAccessPolicyOptions{TableACL: six}); err == nil {
		t.Fatal("six access policies were accepted")
	}

	if _, err := c.SetAccessPolicy(ctx, &aztables.SetAccessPolicyOptions{}); err != nil {
		t.Fatalf("clear access policies: %v", err)
	}
	if target.kind == targetAzurite {
		return // Azurite reads policies as they were when the SAS first came
	}
	_, err = ro.GetEntity(ctx, "p", "r", nil)
	wantStatus(t, err, http.StatusForbidden)
}

// TestServiceProperties: CORS rules set through the SDK are read back.
func TestServiceProperties(t *testing.T) {
	ctx := testCtx(t)
	rule := &aztables.CorsRule{AllowedOrigins: to.Ptr("http://compat.example"), AllowedMethods: to.Ptr("GET,PUT"),
		MaxAgeInSeconds: to.Ptr(int32(60)), ExposedHeaders: to.Ptr("x-ms-*"), AllowedHeaders: to.Ptr("x-ms-meta-*")}
	if _, err := target.svc.SetProperties(ctx, aztables.ServiceProperties{Cors: []*aztables.CorsRule{rule}}, nil); err != nil {
		t.Fatalf("set service properties: %v", err)
	}
	t.Cleanup(func() {
		_, _ = target.svc.SetProperties(t.Context(), aztables.ServiceProperties{Cors: []*aztables.CorsRule{}}, nil)
	})
	got, err := target.svc.GetProperties(ctx, nil)
	if err != nil {
		t.Fatalf("get service properties: %v", err)
	}
	if len(got.Cors) != 1 || *got.Cors[0].AllowedOrigins != "http://compat.example" || *got.Cors[0].MaxAgeInSeconds != 60 {
		t.Fatalf("CORS rules read back: %+v", got.Cors)
	}
}
