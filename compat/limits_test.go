package compat

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/data/aztables"
)

// TestStringAndBinaryLimits: an Edm.String holds at most 32,768 UTF-16
// code units (64 KiB), an Edm.Binary 65,536 bytes; one more is
// PropertyValueTooLarge.
func TestStringAndBinaryLimits(t *testing.T) {
	t.Parallel()
	c := newTable(t)
	ctx := testCtx(t)
	add(t, c, ent("p", "max", map[string]any{"S": strings.Repeat("x", 32768)}))
	if e, _ := get(t, c, "p", "max"); len(e.Properties["S"].(string)) != 32768 {
		t.Fatalf("32,768 characters read back as %d", len(e.Properties["S"].(string)))
	}
	_, err := c.AddEntity(ctx, marshal(t, ent("p", "over", map[string]any{"S": strings.Repeat("x", 32769)})), nil)
	wantErr(t, err, http.StatusBadRequest, "PropertyValueTooLarge")
	// The same through an update.
	_, err = c.UpsertEntity(ctx, marshal(t, ent("p", "max", map[string]any{"S": strings.Repeat("x", 32769)})), nil)
	wantErr(t, err, http.StatusBadRequest, "PropertyValueTooLarge")
	if exists(t, c, "p", "over") {
		t.Fatal("a refused insert inserted")
	}

	add(t, c, ent("p", "maxbin", map[string]any{"B": aztables.EDMBinary(make([]byte, 65536))}))
	if e, _ := get(t, c, "p", "maxbin"); len(e.Properties["B"].(aztables.EDMBinary)) != 65536 {
		t.Fatalf("65,536 bytes read back as %d", len(e.Properties["B"].(aztables.EDMBinary)))
	}
	_, err = c.AddEntity(ctx, marshal(t, ent("p", "overbin", map[string]any{"B": aztables.EDMBinary(make([]byte, 65537))})), nil)
	wantErr(t, err, http.StatusBadRequest, "PropertyValueTooLarge")
}

// TestEntitySize: an entity holds at most 1 MiB of data. 15 strings of
// 32,000 characters (64,000 bytes each in UTF-16, 960 KB in all) fit; 17
// (1,088,000 bytes) do not: 400 EntityTooLarge.
func TestEntitySize(t *testing.T) {
	t.Parallel()
	c := newTable(t)
	props := func(n int) map[string]any {
		m := map[string]any{}
		for i := range n {
			m[fmt.Sprintf("S%02d", i)] = strings.Repeat(string(rune('a'+i)), 32000)
		}
		return m
	}
	add(t, c, ent("p", "under", props(15)))
	if e, _ := get(t, c, "p", "under"); len(e.Properties) != 15 {
		t.Fatalf("read back %d properties", len(e.Properties))
	}
	t.Run("over", func(t *testing.T) {
		skipOnAzurite(t, "it accepts entities over 1 MiB")
		_, err := c.AddEntity(testCtx(t), marshal(t, ent("p", "over", props(17))), nil)
		wantErr(t, err, http.StatusBadRequest, "EntityTooLarge")
		// Growing an entity over the limit by merge is refused too.
		_, err = c.UpdateEntity(testCtx(t), marshal(t, ent("p", "under", map[string]any{"S15": strings.Repeat("y", 32000), "S16": strings.Repeat("z", 32000)})), nil)
		wantErr(t, err, http.StatusBadRequest, "EntityTooLarge")
	})
}

// TestPropertyCount: 252 custom properties (255 with PartitionKey, RowKey
// and Timestamp) are accepted; 253 are TooManyProperties.
func TestPropertyCount(t *testing.T) {
	t.Parallel()
	c := newTable(t)
	props := func(n int) map[string]any {
		m := map[string]any{}
		for i := range n {
			m[fmt.Sprintf("P%03d", i)] = int32(i)
		}
		return m
	}
	add(t, c, ent("p", "max", props(252)))
	if e, _ := get(t, c, "p", "max"); len(e.Properties) != 252 {
		t.Fatalf("read back %d properties", len(e.Properties))
	}
	t.Run("over", func(t *testing.T) {
		skipOnAzurite(t, "it accepts 253 custom properties")
		_, err := c.AddEntity(testCtx(t), marshal(t, ent("p", "over", props(253))), nil)
		wantErr(t, err, http.StatusBadRequest, "TooManyProperties")
	})
}

// TestKeyRules: keys hold at most 1 KiB (512 UTF-16 characters) and no
// '/', '\\', '#', '?' or control characters.
func TestKeyRules(t *testing.T) {
	t.Parallel()
	c := newTable(t)
	ctx := testCtx(t)
	add(t, c, ent(strings.Repeat("k", 512), strings.Repeat("r", 512), nil))
	bad := map[string]string{
		"slash":     "a/b",
		"backslash": `a\b`,
		"hash":      "a#b",
		"question":  "a?b",
		"tab":       "a\tb",
		"nul":       "a\x00b",
		"del":       "a\x7fb",
		"c1":        "a\u0085b",
		"513 chars": strings.Repeat("k", 513),
	}
	for name, k := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := c.AddEntity(ctx, marshal(t, ent(k, "r", nil)), nil)
			wantStatus(t, err, http.StatusBadRequest)
			_, err = c.AddEntity(ctx, marshal(t, ent("p", k, nil)), nil)
			wantStatus(t, err, http.StatusBadRequest)
		})
	}
}

// TestPropertyNames: names follow C# identifier rules, at most 255
// characters.
func TestPropertyNames(t *testing.T) {
	t.Parallel()
	c := newTable(t)
	ctx := testCtx(t)
	add(t, c, ent("p", "ok", map[string]any{"_under": 1, "Ünïcode": 2, strings.Repeat("n", 255): 3}))
	for name, prop := range map[string]string{
		"dash":          "a-b",
		"leading digit": "1a",
		"space":         "a b",
		"dot":           "a.b",
		"256 chars":     strings.Repeat("n", 256),
	} {
		t.Run(name, func(t *testing.T) {
			skipOnAzurite(t, "it accepts any property name")
			_, err := c.AddEntity(ctx, marshal(t, ent("p", name, map[string]any{prop: 1})), nil)
			wantStatus(t, err, http.StatusBadRequest)
			if exists(t, c, "p", name) {
				t.Fatal("a refused insert inserted")
			}
		})
	}
}
