package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/agentproto"
)

// agent is a prepared agent: key loaded, pid file locked, answer built.
type agent struct {
	init    agentproto.Init
	key     ed25519.PrivateKey
	pidFile *os.File
	answer  []byte
	client  *http.Client
	// boot and digest go in every heartbeat (version 2); boot is uuid.Nil
	// when the boot identity could not be read, and the heartbeats are
	// then of version 1.
	boot   uuid.UUID
	digest [agentproto.DigestSize]byte
}

// prepare does everything that can fail before the agent answers, so that
// an answer means a running agent.
func prepare(cfg config, init agentproto.Init, logger *log.Logger) (*agent, error) {
	key, created, err := loadOrCreateKey(cfg.keyFile)
	if err != nil {
		return nil, err
	}
	pub := key.Public().(ed25519.PublicKey)
	if created {
		logger.Printf("created a new key in %s", cfg.keyFile)
	}
	client, err := newClient(init)
	if err != nil {
		return nil, err
	}
	answer, err := agentproto.EncodeAnswer(agentproto.Answer{PublicKey: pub, Init: init})
	if err != nil {
		return nil, err
	}
	pidFile, err := lockPIDFile(cfg.pidFile, logger)
	if err != nil {
		return nil, err
	}
	boot, err := readBootID(cfg.bootIDFile)
	if err != nil {
		// Heartbeats still tell Shepherd the machine is up; only whether
		// it rebooted is lost (Recovery is then open loop for it).
		logger.Printf("no boot identity, heartbeats of protocol version 1: Shepherd cannot verify this machine's reboots: %v", err)
	}
	digest, err := executableDigest()
	if err != nil {
		logger.Printf("no build digest (heartbeats carry zeros): %v", err)
	}
	// The public key is logged so that an operator can match it with
	// machine_agent_started; the private key never is.
	logger.Printf("started: machine %s, heartbeat URL %s every %s, public key %s, boot %s, build sha256 %x",
		init.MachineID, init.HeartbeatURL, init.Interval(), base64.StdEncoding.EncodeToString(pub), boot, digest)
	return &agent{init: init, key: key, pidFile: pidFile, answer: answer, client: client, boot: boot, digest: digest}, nil
}

// release empties and unlocks the pid file: an empty file says no agent
// runs, so that `kill $(cat PID_FILE)` cannot hit a recycled pid.
func (a *agent) release() {
	if a.pidFile != nil {
		_ = a.pidFile.Truncate(0)
		a.pidFile.Close()
	}
}

// newClient returns the HTTP client for heartbeats: the init's CA (or the
// system roots), no proxy from the environment (the endpoint is Shepherd's,
// reached directly), no redirects (a redirected POST could end anywhere).
func newClient(init agentproto.Init) (*http.Client, error) {
	pool, err := init.CertPool()
	if err != nil {
		return nil, err
	}
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			Proxy:               nil,
			TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout: 10 * time.Second,
			IdleConnTimeout:     2 * init.Interval(),
			MaxIdleConnsPerHost: 1,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}, nil
}

// heartbeat sends a heartbeat now and then every interval, until ctx ends.
// It logs changes (first success, first failure, recovery) and every 100th
// consecutive failure rather than every attempt, so that a long outage
// does not fill the disk.
func (a *agent) heartbeat(ctx context.Context, logger *log.Logger) error {
	ticker := time.NewTicker(a.init.Interval())
	defer ticker.Stop()
	var last time.Time
	failures, sent := 0, 0
	for {
		ts := nextTimestamp(time.Now().Round(0), last)
		last = ts
		err := a.send(ctx, ts)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			failures++
			if failures == 1 || failures%100 == 0 {
				logger.Printf("heartbeat failed (%d in a row): %v", failures, err)
			}
		default:
			switch {
			case failures > 0:
				logger.Printf("heartbeat accepted again, after %d failures", failures)
			case sent == 0:
				logger.Printf("first heartbeat accepted")
			}
			failures = 0
			sent++
		}
		select {
		case <-ctx.Done():
			logger.Printf("stopping: %v", context.Cause(ctx))
			return nil
		case <-ticker.C:
		}
	}
}

// send POSTs one heartbeat.
func (a *agent) send(ctx context.Context, ts time.Time) error {
	var hb agentproto.Heartbeat
	var err error
	if a.boot == uuid.Nil {
		hb, err = agentproto.NewHeartbeatV1(a.init.MachineID, ts, a.key)
	} else {
		hb, err = agentproto.NewHeartbeat(a.init.MachineID, ts, a.boot, a.digest, a.key)
	}
	if err != nil {
		return err
	}
	body, err := agentproto.EncodeHeartbeat(hb)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.init.HeartbeatURL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("building the request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", fmt.Sprintf("shepherd-agent/%d", hb.Version))
	resp, err := a.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	reason, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %q", resp.Status, bytes.TrimSpace(reason))
	}
	return nil
}

// maxClockStepBack is how far the wall clock may step back before the
// agent follows it instead of keeping its timestamps increasing.
const maxClockStepBack = time.Second

// nextTimestamp is the timestamp of the heartbeat sent at now after one
// stamped last. Timestamps increase strictly, since the endpoint refuses
// one not newer than the last it accepted and a clock slewing back a little
// would otherwise repeat one. But after a large step back (a clock that ran
// ahead, then corrected), keeping last+1µs would stamp every heartbeat in
// the past-corrected future, which the endpoint refuses as outside its
// clock skew until the clock catches up, while Recovery sees a silent
// agent: the agent then follows the clock again.
func nextTimestamp(now, last time.Time) time.Time {
	if now.After(last) || last.Sub(now) > maxClockStepBack {
		return now
	}
	return last.Add(time.Microsecond)
}
