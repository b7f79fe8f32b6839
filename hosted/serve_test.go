package hosted

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"agentkit/kv/hostedkv/wire"
)

// serveInBackground runs Serve and returns the address and a channel with
// its result.
func serveInBackground(t *testing.T, ctx context.Context, svc *Service, cfg ServeConfig) (string, <-chan error) {
	t.Helper()
	addrc := make(chan net.Addr, 1)
	cfg.Addr = "127.0.0.1:0"
	cfg.OnListen = func(a net.Addr) { addrc <- a }
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, svc, cfg) }()
	select {
	case a := <-addrc:
		return a.String(), done
	case err := <-done:
		t.Fatalf("Serve returned before listening: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not listen within 10s")
	}
	return "", nil
}

func TestShutdownFinishesRequestsInFlight(t *testing.T) {
	ts := newTestService(t, Options{}, "alpha")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, done := serveInBackground(t, ctx, ts.svc, ServeConfig{ShutdownTimeout: 30 * time.Second})

	// A write whose body is still arriving when the shutdown starts.
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("PUT", "http://"+addr+kvPath("alpha", "in-flight"), pr)
	req.Header.Set("Authorization", "Bearer "+ts.tokens["alpha"])
	req.Header.Set(wire.HeaderRequestID, newID())
	status := make(chan int, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			status <- 0
			return
		}
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	pw.Write([]byte("first half, "))
	// Wait until the service holds the request, then shut down.
	waitFor(t, "the request to be in flight", func() bool { return gaugeValue(ts.svc) >= 1 })
	cancel()
	// The listener closes: new connections are refused ...
	waitFor(t, "new connections to be refused", func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case err := <-done:
		t.Fatalf("Serve returned (%v) with a request in flight", err)
	default:
	}
	// ... and the request in flight still completes.
	pw.Write([]byte("second half"))
	pw.Close()
	if st := <-status; st != http.StatusNoContent {
		t.Fatalf("the request in flight during shutdown ended with %d, want 204", st)
	}
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	v, _, err := ts.svc.st.get(context.Background(), "alpha", "in-flight")
	if err != nil || string(v) != "first half, second half" {
		t.Fatalf("the value written during shutdown: %q, %v", v, err)
	}
}

func gaugeValue(s *Service) float64 {
	mfs, _ := s.m.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "agentkit_storaged_requests_in_flight" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T, dir, name string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestTLSFromFilesAndReload(t *testing.T) {
	ts := newTestService(t, Options{CredentialPoll: 10 * time.Millisecond}, "alpha")
	dir := t.TempDir()
	certFile, keyFile, pool1 := selfSigned(t, dir, "one")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, done := serveInBackground(t, ctx, ts.svc, ServeConfig{TLSCert: certFile, TLSKey: keyFile})
	client := func(pool *x509.CertPool) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	}
	get := func(c *http.Client, scheme string) (int, error) {
		resp, err := c.Get(scheme + "://" + addr + "/healthz")
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if st, err := get(client(pool1), "https"); err != nil || st != 200 {
		t.Fatalf("https with the certificate trusted: %d, %v", st, err)
	}
	if st, err := get(http.DefaultClient, "http"); err == nil && st == 200 {
		t.Fatal("plain http is served on the TLS port")
	}
	// Replacing the files is picked up without a restart.
	c2, k2, pool2 := selfSigned(t, dir, "two")
	data, _ := os.ReadFile(c2)
	kdata, _ := os.ReadFile(k2)
	os.WriteFile(keyFile+".new", kdata, 0o600)
	os.WriteFile(certFile+".new", data, 0o600)
	os.Rename(keyFile+".new", keyFile)
	os.Rename(certFile+".new", certFile)
	waitFor(t, "the new certificate to be served", func() bool {
		st, err := get(client(pool2), "https")
		return err == nil && st == 200
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestServeRefusesHalfTLS(t *testing.T) {
	ts := newTestService(t, Options{}, "alpha")
	err := Serve(context.Background(), ts.svc, ServeConfig{Addr: "127.0.0.1:0", TLSCert: "x.pem"})
	if err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("Serve with a certificate and no key: %v", err)
	}
}
