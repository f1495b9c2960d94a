package sshagent

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/shepherd-fleet/shepherd/agentproto"
)

// Config is how Shepherd reaches machines over SSH and what it starts there.
type Config struct {
	// KeyFile is the private key Shepherd logs in with (OpenSSH or PEM
	// format, unencrypted). The key is only ever read from this file.
	KeyFile string
	// KnownHostsFile, if set, is an OpenSSH known_hosts file that every host
	// key must match. When empty, host keys are trusted on first use: the
	// first key a machine presents is pinned in the BMDB and any other key
	// is refused afterwards.
	KnownHostsFile string
	// ConnectTimeout bounds connecting: TCP, SSH handshake and login.
	ConnectTimeout time.Duration
	// UploadTimeout bounds uploading the agent binary over SFTP.
	UploadTimeout time.Duration
	// ExecTimeout bounds running one remote command: the agent until it
	// answers and detaches, or the reboot command.
	ExecTimeout time.Duration

	// AgentBinary is the local shepherd-agent executable that AgentStart
	// uploads (built for the machines' OS and architecture).
	AgentBinary string
	// RemotePath is where the agent is installed on the machine; a relative
	// path is relative to the SSH user's home directory. The agent keeps
	// its state next to it: agent.key (its ed25519 key, kept across
	// restarts), agent.pid (locked while it runs; kill $(cat agent.pid)
	// stops it) and agent.log.
	RemotePath string
	// HeartbeatURL is the URL of Shepherd's heartbeat endpoint as the
	// machines reach it (for example https://shepherd.example:7443/agent/v1/heartbeat),
	// sent to each agent in its init message.
	HeartbeatURL string
	// HeartbeatCAFile, optional, is a PEM file of the certificates agents
	// trust for an https HeartbeatURL instead of their system roots.
	HeartbeatCAFile string
	// HeartbeatInterval is how often agents heartbeat (0: the agent's
	// default).
	HeartbeatInterval time.Duration

	// RebootCommand is the remote command that reboots a machine without a
	// BMC, run through the SSH user's shell.
	RebootCommand string
}

// DefaultConfig returns the configuration before flags.
func DefaultConfig() Config {
	return Config{
		ConnectTimeout: 30 * time.Second,
		UploadTimeout:  5 * time.Minute,
		ExecTimeout:    time.Minute,
		RemotePath:     ".shepherd/shepherd-agent",
		RebootCommand:  "sudo -n systemctl reboot",
	}
}

// RegisterFlags registers the SSH flags on fs, with the values in c as
// defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.KeyFile, "ssh_key_file", c.KeyFile, "private key file Shepherd logs in to machines with (unencrypted; never pass a key on the command line)")
	fs.StringVar(&c.KnownHostsFile, "ssh_known_hosts", c.KnownHostsFile, "OpenSSH known_hosts file that machines' host keys must match; empty: trust each machine's first key and pin it in the BMDB")
	fs.DurationVar(&c.ConnectTimeout, "agent_ssh_connect_timeout", c.ConnectTimeout, "bound on connecting to a machine over SSH (TCP, handshake, login)")
	fs.DurationVar(&c.UploadTimeout, "agent_ssh_upload_timeout", c.UploadTimeout, "bound on uploading the agent binary over SFTP")
	fs.DurationVar(&c.ExecTimeout, "agent_ssh_exec_timeout", c.ExecTimeout, "bound on one remote command over SSH (starting the agent until it answers, or rebooting)")
	fs.StringVar(&c.AgentBinary, "agent_binary", c.AgentBinary, "local shepherd-agent executable that AgentStart uploads to machines")
	fs.StringVar(&c.RemotePath, "agent_remote_path", c.RemotePath, "where the agent is installed on machines (relative: to the SSH user's home); its key, pid file and log go in the same directory")
	fs.StringVar(&c.HeartbeatURL, "agent_heartbeat_url", c.HeartbeatURL, "URL of this daemon's heartbeat endpoint as machines reach it, e.g. https://shepherd.example:7443/agent/v1/heartbeat; sent to each agent")
	fs.StringVar(&c.HeartbeatCAFile, "agent_heartbeat_ca_file", c.HeartbeatCAFile, "PEM certificates agents trust for an https -agent_heartbeat_url (default: their system roots)")
	fs.DurationVar(&c.HeartbeatInterval, "agent_heartbeat_interval", c.HeartbeatInterval, "how often agents heartbeat (0: the agent's default)")
	fs.StringVar(&c.RebootCommand, "ssh_reboot_command", c.RebootCommand, "remote command that reboots a machine without a BMC")
}

// Check validates the configuration and that its files can be read; its
// errors name the flag.
func (c *Config) Check() error {
	switch {
	case c.KeyFile == "":
		return errors.New("-ssh_key_file: required: the private key Shepherd logs in to machines with")
	case c.ConnectTimeout <= 0:
		return fmt.Errorf("-agent_ssh_connect_timeout %s: must be positive", c.ConnectTimeout)
	case c.UploadTimeout <= 0:
		return fmt.Errorf("-agent_ssh_upload_timeout %s: must be positive", c.UploadTimeout)
	case c.ExecTimeout <= 0:
		return fmt.Errorf("-agent_ssh_exec_timeout %s: must be positive", c.ExecTimeout)
	case c.AgentBinary == "":
		return errors.New("-agent_binary: required: the shepherd-agent executable to upload")
	case c.RemotePath == "" || strings.ContainsAny(c.RemotePath, "\x00\r\n") || strings.HasSuffix(c.RemotePath, "/"):
		return fmt.Errorf("-agent_remote_path %q: want a file path", c.RemotePath)
	case strings.TrimSpace(c.RebootCommand) == "" || strings.ContainsAny(c.RebootCommand, "\x00\r\n"):
		return fmt.Errorf("-ssh_reboot_command %q: want a one-line command", c.RebootCommand)
	}
	if _, err := loadSigner(c.KeyFile); err != nil {
		return fmt.Errorf("-ssh_key_file: %w", err)
	}
	if c.KnownHostsFile != "" {
		if _, err := loadKnownHosts(c.KnownHostsFile); err != nil {
			return fmt.Errorf("-ssh_known_hosts: %w", err)
		}
	}
	if st, err := os.Stat(c.AgentBinary); err != nil {
		return fmt.Errorf("-agent_binary: %w", err)
	} else if !st.Mode().IsRegular() {
		return fmt.Errorf("-agent_binary %s: not a regular file", c.AgentBinary)
	}
	if _, err := c.initTemplate(); err != nil {
		return err
	}
	return nil
}

// initTemplate returns the init message without its machine id, checking
// the heartbeat flags.
func (c *Config) initTemplate() (agentproto.Init, error) {
	i := agentproto.Init{HeartbeatURL: c.HeartbeatURL, HeartbeatInterval: c.HeartbeatInterval}
	if c.HeartbeatURL == "" {
		return i, errors.New("-agent_heartbeat_url: required: the URL at which machines reach this daemon's heartbeat endpoint")
	}
	if c.HeartbeatCAFile != "" {
		pem, err := os.ReadFile(c.HeartbeatCAFile)
		if err != nil {
			return i, fmt.Errorf("-agent_heartbeat_ca_file: %w", err)
		}
		i.CACertPEM = string(pem)
	}
	// Validate with a placeholder id: everything else must already be sound.
	probe := i
	probe.MachineID[15] = 1
	if err := probe.Validate(); err != nil {
		return i, fmt.Errorf("agent heartbeat flags (-agent_heartbeat_url, -agent_heartbeat_ca_file, -agent_heartbeat_interval): %w", err)
	}
	return i, nil
}
