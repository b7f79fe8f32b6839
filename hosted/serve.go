package hosted

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// DefaultShutdownTimeout is how long Serve lets requests in flight finish
// after its context ends.
const DefaultShutdownTimeout = 30 * time.Second

// ServeConfig says where and how Serve listens.
type ServeConfig struct {
	// Addr is HOST:PORT; port 0 picks a free port.
	Addr string
	// TLSCert and TLSKey are PEM files. When both are set the service
	// speaks HTTPS only; Reload reads them again.
	TLSCert, TLSKey string
	// ShutdownTimeout bounds the wait for requests in flight once ctx
	// ends; zero means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// OnListen, when set, is called with the bound address before the
	// first request is served.
	OnListen func(net.Addr)
}

// certificate holds a TLS certificate that can be replaced while serving.
type certificate struct {
	mu         sync.RWMutex
	cert       *tls.Certificate
	certFile   string
	keyFile    string
	lastStamps string
}

func (c *certificate) load() error {
	stamps := fileStamp(c.certFile) + " " + fileStamp(c.keyFile)
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("hosted: load the TLS certificate %s and key %s: %w", c.certFile, c.keyFile, err)
	}
	c.mu.Lock()
	c.cert, c.lastStamps = &cert, stamps
	c.mu.Unlock()
	return nil
}

func (c *certificate) changed() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return fileStamp(c.certFile)+" "+fileStamp(c.keyFile) != c.lastStamps
}

func (c *certificate) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.cert, nil
}

// Serve serves s on cfg.Addr until ctx ends, then stops accepting
// connections, lets requests in flight finish (up to ShutdownTimeout) and
// returns. It runs s.Run in the background meanwhile, and reloads the TLS
// certificate when its files change. It does not close s.
func Serve(ctx context.Context, s *Service, cfg ServeConfig) error {
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return errors.New("hosted: give both a TLS certificate and its key, or neither")
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	var cert *certificate
	if cfg.TLSCert != "" {
		cert = &certificate{certFile: cfg.TLSCert, keyFile: cfg.TLSKey}
		if err := cert.load(); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("hosted: listen on %s: %w", cfg.Addr, err)
	}
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       maxRequestTime,
		WriteTimeout:      maxRequestTime + backendTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	if cert != nil {
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: cert.get}
	}
	bg, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.Run(bg)
	}()
	if cert != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(s.opts.CredentialPoll)
			defer t.Stop()
			for {
				select {
				case <-bg.Done():
					return
				case <-t.C:
					if cert.changed() {
						if err := cert.load(); err != nil {
							s.log.Error("storaged: the TLS files changed but do not load; the previous certificate stays in use", slog.Any("error", err))
						} else {
							s.log.Info("storaged: TLS certificate reloaded")
						}
					}
				}
			}
		}()
	}
	if cfg.OnListen != nil {
		cfg.OnListen(ln.Addr())
	}
	scheme := "http"
	if cert != nil {
		scheme = "https"
	}
	s.log.Info("storaged: serving", slog.String("addr", scheme+"://"+ln.Addr().String()), slog.String("backend", s.st.kind()))
	errc := make(chan error, 1)
	go func() {
		if cert != nil {
			errc <- srv.ServeTLS(ln, "", "")
		} else {
			errc <- srv.Serve(ln)
		}
	}()
	var serveErr error
	select {
	case serveErr = <-errc:
	case <-ctx.Done():
		s.log.Info("storaged: shutting down; finishing requests in flight", slog.String("timeout", cfg.ShutdownTimeout.String()))
		sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		err := srv.Shutdown(sctx)
		cancel()
		if err != nil {
			s.log.Warn("storaged: requests were still running at the shutdown timeout", slog.Any("error", err))
			srv.Close()
		}
		<-errc
	}
	stopBg()
	wg.Wait()
	if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	return serveErr
}
