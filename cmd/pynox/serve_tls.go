package main

import (
	"crypto/tls"
	"fmt"
	"sync/atomic"
)

// certSource is the certificate `pynox serve --tls-cert --tls-key`
// serves. The files are read before the process confines itself, and
// reread on SIGHUP by readers started then (see startTokenReader): a
// self-confined server may no longer open them itself.
type certSource struct {
	certPath, keyPath string
	readCert, readKey func() ([]byte, error)
	cert              atomic.Pointer[tls.Certificate]
}

// loadCerts reads and checks the certificate chain and key at certPath
// and keyPath, and starts the readers that reread them on SIGHUP. Its
// errors name the flag of the file at fault.
func loadCerts(certPath, keyPath string) (*certSource, error) {
	cs := &certSource{certPath: certPath, keyPath: keyPath}
	if _, err := readSmallFile(certPath); err != nil {
		return nil, fmt.Errorf("--tls-cert=%s: %v", certPath, err)
	}
	if _, err := readSmallFile(keyPath); err != nil {
		return nil, fmt.Errorf("--tls-key=%s: %v", keyPath, err)
	}
	var err error
	if cs.readCert, err = startTokenReader(certPath); err != nil {
		return nil, fmt.Errorf("--tls-cert=%s: starting its reader: %v", certPath, err)
	}
	if cs.readKey, err = startTokenReader(keyPath); err != nil {
		return nil, fmt.Errorf("--tls-key=%s: starting its reader: %v", keyPath, err)
	}
	if err := cs.reload(); err != nil {
		return nil, err
	}
	return cs, nil
}

// reload rereads both files; on error the certificate in use stays.
func (cs *certSource) reload() error {
	certPEM, err := cs.readCert()
	if err != nil {
		return fmt.Errorf("--tls-cert=%s: %v", cs.certPath, err)
	}
	keyPEM, err := cs.readKey()
	if err != nil {
		return fmt.Errorf("--tls-key=%s: %v", cs.keyPath, err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("--tls-cert=%s, --tls-key=%s: %v (expected a PEM certificate chain and its PEM private key)", cs.certPath, cs.keyPath, err)
	}
	cs.cert.Store(&cert)
	return nil
}

// tlsConfig serves the current certificate, TLS 1.2 at least, HTTP/1.1
// only (a WebSocket upgrade needs it).
func (cs *certSource) tlsConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return cs.cert.Load(), nil
		},
	}
}
