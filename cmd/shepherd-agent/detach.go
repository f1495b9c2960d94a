package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/shepherd-fleet/shepherd/agentproto"
)

// readyTimeout bounds the wait for the background copy: terminating a
// previous agent takes up to pidLockTimeout, and key creation is quick.
const readyTimeout = pidLockTimeout + 15*time.Second

// detach starts the background copy and returns its answer line.
func detach(cfg config, init agentproto.Init) ([]byte, error) {
	initLine, err := agentproto.EncodeInit(init)
	if err != nil {
		return nil, err
	}
	// /proc/self/exe, not os.Args[0]: it works however the agent was
	// invoked, and even if the uploaded binary has been removed since.
	exe := "/proc/self/exe"
	if _, err := os.Stat(exe); err != nil {
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("finding the agent binary: %w", err)
		}
	}

	var out *os.File // the daemon's stdout and stderr: its log
	if cfg.logFile != "" {
		if out, err = openLog(cfg.logFile); err != nil {
			return nil, err
		}
		defer out.Close()
	}
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("creating a pipe: %w", err)
	}
	defer stdinW.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		return nil, fmt.Errorf("creating a pipe: %w", err)
	}
	defer readyR.Close()

	cmd := exec.Command(exe, "-daemon",
		"-key_file="+cfg.keyFile, "-pid_file="+cfg.pidFile, "-log_file="+cfg.logFile, "-boot_id_file="+cfg.bootIDFile)
	cmd.Args[0] = "shepherd-agent"
	cmd.Dir = "/"
	cmd.Stdin = stdinR
	if out != nil {
		cmd.Stdout, cmd.Stderr = out, out
	}
	cmd.ExtraFiles = []*os.File{readyW} // readyFD in the child
	// A session of its own: no controlling terminal, so no SIGHUP when
	// the SSH session ends, and not in the session's process group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	// The child has its copies; with ours closed, the ready pipe reads EOF
	// as soon as the child exits.
	stdinR.Close()
	readyW.Close()
	if err != nil {
		return nil, fmt.Errorf("starting the background agent: %w", err)
	}
	pid := cmd.Process.Pid
	// Not waited for: it outlives this process, and init reaps it.
	_ = cmd.Process.Release()

	if _, err := stdinW.Write(append(initLine, '\n')); err != nil {
		return nil, fmt.Errorf("passing the init message to the background agent (pid %d): %w", pid, err)
	}
	stdinW.Close()

	_ = readyR.SetReadDeadline(time.Now().Add(readyTimeout))
	line, err := bufio.NewReader(io.LimitReader(readyR, agentproto.MaxAnswerSize+1024)).ReadString('\n')
	line = strings.TrimSuffix(line, "\n")
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, fmt.Errorf("the background agent (pid %d) was not ready within %s; see %s", pid, readyTimeout, describeLog(cfg.logFile))
	case strings.HasPrefix(line, "error: "):
		return nil, fmt.Errorf("the background agent failed: %s", strings.TrimPrefix(line, "error: "))
	case err != nil:
		return nil, fmt.Errorf("the background agent (pid %d) exited before it was ready; see %s", pid, describeLog(cfg.logFile))
	}
	// Checked here so that what reaches stdout is always a valid answer.
	answer, err := agentproto.DecodeAnswer([]byte(line))
	if err != nil {
		return nil, fmt.Errorf("the background agent answered badly: %w", err)
	}
	if err := answer.CheckEcho(init); err != nil {
		return nil, fmt.Errorf("the background agent answered badly: %w", err)
	}
	return []byte(line), nil
}

func describeLog(path string) string {
	if path == "" {
		return "its log (none: -log_file is empty)"
	}
	return path
}
