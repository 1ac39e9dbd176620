package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// writeSelfSigned writes a self-signed certificate for 127.0.0.1 named cn
// and its key as PEM files in dir, and returns them and the certificate.
func writeSelfSigned(t *testing.T, dir, cn string) (certPath, keyPath string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err = x509.ParseCertificate(der)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certPath, keyPath = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	require.NoError(t, os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	return certPath, keyPath, cert
}

// TestServeTLS: with --tls-cert and --tls-key the server speaks HTTPS and
// WSS only, with the certificate read (before the process confines
// itself) from outside the read ceiling; POST /v1/run and a job over the
// WebSocket work over TLS; SIGHUP rereads both files and new connections
// get the new certificate.
func TestServeTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// Outside the working directory, the read ceiling.
	tlsDir := t.TempDir()
	certPath, keyPath, cert := writeSelfSigned(t, tlsDir, "pynox-one")
	s := startServe(t, dir, "--tls-cert="+certPath, "--tls-key="+keyPath)
	require.True(t, strings.HasPrefix(s.base, "https://"), s.base)

	roots := x509.NewCertPool()
	roots.AddCert(cert)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	post := func(c *http.Client) (int, string, *tls.ConnectionState) {
		req, err := http.NewRequest("POST", s.base+"/v1/run", strings.NewReader(`{"id": 1, "code": "print(6 * 7)"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b), resp.TLS
	}
	code, body, st := post(client)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"stdout":"42\n"`)
	require.Equal(t, "pynox-one", st.PeerCertificates[0].Subject.CommonName)

	// Plain HTTP on the TLS port gets no answer of the server's.
	resp, err := http.Get("http://" + strings.TrimPrefix(s.base, "https://") + "/healthz")
	if err == nil {
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "Go's TLS server answers plain HTTP with 400")
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, s.wsURL(), &websocket.DialOptions{HTTPClient: client})
	require.NoError(t, err)
	defer c.CloseNow()
	require.True(t, strings.HasPrefix(s.wsURL(), "wss://"))
	ws := &wsProc{c: c}
	require.Equal(t, "ready", ws.next(t)["event"])
	ws.send(t, `{"id": "w", "code": "print(6 * 7)"}`)
	require.Equal(t, "42\n", ws.next(t)["stdout"])

	// SIGHUP: a new certificate in the same files.
	_, _, cert2 := writeSelfSigned(t, tlsDir, "pynox-two")
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(s.stderr.String(), "reloaded --tls-cert") },
		time.Minute, 10*time.Millisecond)
	roots2 := x509.NewCertPool()
	roots2.AddCert(cert2)
	client2 := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots2}}}
	code, body, st = post(client2)
	require.Equal(t, 200, code, body)
	require.Equal(t, "pynox-two", st.PeerCertificates[0].Subject.CommonName)

	// A broken key file keeps the certificate in use.
	require.NoError(t, os.WriteFile(keyPath, []byte("not a key\n"), 0o600))
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(s.stderr.String(), "the certificate in use stays") },
		time.Minute, 10*time.Millisecond)
	code, _, st = post(client2)
	require.Equal(t, 200, code)
	require.Equal(t, "pynox-two", st.PeerCertificates[0].Subject.CommonName)
}

// TestServeTLSFlagErrors: --tls-cert and --tls-key go together, and a
// file that is missing or not PEM is named by its flag before anything
// starts.
func TestServeTLSFlagErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certPath, keyPath, _ := writeSelfSigned(t, dir, "x")
	bad := filepath.Join(dir, "bad.pem")
	require.NoError(t, os.WriteFile(bad, []byte("junk"), 0o600))
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--tls-cert=" + certPath}, 2, "pynox serve: --tls-cert=" + certPath + " needs --tls-key=FILE"},
		{[]string{"--tls-key=" + keyPath}, 2, "pynox serve: --tls-key=" + keyPath + " needs --tls-cert=FILE"},
		{[]string{"--tls-cert=" + certPath, "--tls-key=" + dir + "/nonexistent"}, 1, "pynox serve: --tls-key=" + dir + "/nonexistent: open "},
		{[]string{"--tls-cert=" + bad, "--tls-key=" + keyPath}, 1, "pynox serve: --tls-cert=" + bad + ", --tls-key=" + keyPath + ": tls: failed to find any PEM data in certificate input"},
	} {
		cmd := exec.Command(pynoxBinary(t), append([]string{"serve", "--listen=127.0.0.1:0", "--python=" + testenv.Python()}, tc.args...)...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "%q", tc.args)
		require.Equal(t, tc.code, cmd.ProcessState.ExitCode(), "%q: %s", tc.args, out)
		require.True(t, strings.HasPrefix(string(out), tc.want), "%q: got %q", tc.args, out)
	}
}
