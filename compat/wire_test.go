package compat

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// rawDo sends one request the way the SDKs do, signed with the Shared Key
// (not Lite) Table form, which the Go SDK does not use:
//
//	VERB \n Content-MD5 \n Content-Type \n Date \n CanonicalizedResource
//
// Headers default to x-ms-version 2019-02-02, DataServiceVersion 3.0,
// Accept nometadata and, with a body, Content-Type application/json;
// hdr overrides them.
func rawDo(t *testing.T, method, path string, hdr map[string]string, body, key string) (*http.Response, string) {
	t.Helper()
	u := target.endpoint + path
	req, err := http.NewRequestWithContext(testCtx(t), method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	date := time.Now().UTC().Format(http.TimeFormat)
	req.Header.Set("x-ms-date", date)
	req.Header.Set("x-ms-version", "2019-02-02")
	req.Header.Set("DataServiceVersion", "3.0")
	req.Header.Set("Accept", "application/json;odata=nometadata")
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	canon := "/" + target.account + pu.EscapedPath()
	if comp := pu.Query().Get("comp"); comp != "" {
		canon += "?comp=" + comp
	}
	sts := strings.Join([]string{method, req.Header.Get("Content-MD5"), req.Header.Get("Content-Type"), date, canon}, "\n")
	k, err := base64.StdEncoding.DecodeString(key)
	if err != nil {
		t.Fatal(err)
	}
	mac := hmac.New(sha256.New, k)
	mac.Write([]byte(sts))
	req.Header.Set("Authorization", fmt.Sprintf("SharedKey %s:%s", target.account, base64.StdEncoding.EncodeToString(mac.Sum(nil))))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read the body: %v", method, u, err)
	}
	return resp, string(b)
}

// TestWireDetails: what the SDK hides: the error body and header,
// Prefer, the x-ms-version values current SDKs send, the ETag form.
func TestWireDetails(t *testing.T) {
	t.Parallel()
	c, name := newNamedTable(t)
	add(t, c, ent("p", "r", nil))

	// Errors: x-ms-error-code and an odata.error body.
	resp, body := rawDo(t, "GET", "/"+name+"(PartitionKey='p',RowKey='missing')", nil, "", target.key)
	if resp.StatusCode != http.StatusNotFound || resp.Header.Get("x-ms-error-code") != "ResourceNotFound" {
		t.Fatalf("missing entity: %d x-ms-error-code %q: %s", resp.StatusCode, resp.Header.Get("x-ms-error-code"), body)
	}
	var oe struct {
		Err struct {
			Code    string `json:"code"`
			Message struct {
				Lang  string `json:"lang"`
				Value string `json:"value"`
			} `json:"message"`
		} `json:"odata.error"`
	}
	if err := json.Unmarshal([]byte(body), &oe); err != nil || oe.Err.Code != "ResourceNotFound" || oe.Err.Message.Value == "" {
		t.Fatalf("error body %q (%v): want {\"odata.error\":{\"code\":\"ResourceNotFound\",\"message\":{...}}}", body, err)
	}
	if resp.Header.Get("x-ms-request-id") == "" || resp.Header.Get("x-ms-version") == "" {
		t.Errorf("error answer lacks x-ms-request-id or x-ms-version: %v", resp.Header)
	}

	// Prefer: return-no-content gives 204 and says so; return-content 201
	// with the entity.
	resp, body = rawDo(t, "POST", "/"+name, map[string]string{"Prefer": "return-no-content"}, `{"PartitionKey":"p","RowKey":"nc"}`, target.key)
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Preference-Applied") != "return-no-content" || resp.Header.Get("ETag") == "" {
		t.Errorf("insert with return-no-content: %d Preference-Applied %q ETag %q: %s", resp.StatusCode, resp.Header.Get("Preference-Applied"), resp.Header.Get("ETag"), body)
	}
	resp, body = rawDo(t, "POST", "/"+name, map[string]string{"Prefer": "return-content"}, `{"PartitionKey":"p","RowKey":"c","X":"x"}`, target.key)
	if resp.StatusCode != http.StatusCreated || !strings.Contains(body, `"X":"x"`) {
		t.Errorf("insert with return-content: %d: %s", resp.StatusCode, body)
	}

	// The ETag is a weak datetime ETag, and odata.etag carries the same.
	etag := resp.Header.Get("ETag")
	if !strings.HasPrefix(etag, `W/"datetime'`) || !strings.HasSuffix(etag, `'"`) {
		t.Errorf("ETag %q: want W/\"datetime'...'\"", etag)
	}

	// The x-ms-version values of the current SDKs (Go, Python, JS and .NET
	// tables SDKs send 2019-02-02; storage tools send newer ones).
	for _, v := range []string{"2019-02-02", "2020-12-06", "2021-12-02", "2023-11-03", "2025-11-05"} {
		resp, body = rawDo(t, "GET", "/Tables", map[string]string{"x-ms-version": v}, "", target.key)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("x-ms-version %s: %d %s", v, resp.StatusCode, body)
		}
	}
}
