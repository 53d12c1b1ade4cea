# llamacpp-exporter as a Windows service through NSSM (https://nssm.cc): restarted 5 s after any exit,
# stopped with Ctrl-C first (a clean exit), its output in rotated files. Run in an elevated PowerShell
# with nssm.exe on the PATH:
#
#   powershell -ExecutionPolicy Bypass -File install-nssm-service.ps1 -LogFile C:\llama\logs\llama-server.stderr
#
# It follows the file your wrapper writes llama-server's stderr to (the wrapper renames the last run's
# file to llama-server.stderr.prev-<time> before each restart: the exporter follows the new file by
# its path and counts each start). Remove it with: nssm remove llamacpp-exporter confirm
param(
    [string]$Exe = "C:\llamacpp-exporter\venv\Scripts\llamacpp-exporter.exe",
    [string]$LogFile = "C:\llama\logs\llama-server.stderr",
    [string]$ServerUrl = "http://127.0.0.1:8080",
    [string]$ListenAddress = "127.0.0.1:9778",
    [string]$OutputDir = "C:\llamacpp-exporter\logs",
    [string]$ServiceName = "llamacpp-exporter"
)
$ErrorActionPreference = "Stop"

# One argument per line; a path with spaces is quoted for the command line NSSM runs.
$ExporterArgs = @(
    "--log-file", $LogFile,
    "--server-url", $ServerUrl,
    "--listen-address", $ListenAddress
)
$Parameters = ($ExporterArgs | ForEach-Object { if ($_ -match '\s') { '"' + $_ + '"' } else { $_ } }) -join " "

New-Item -ItemType Directory -Force -Path $OutputDir | Out-Null
nssm install $ServiceName $Exe
nssm set $ServiceName AppParameters $Parameters
nssm set $ServiceName AppDirectory (Split-Path -Parent $Exe)
nssm set $ServiceName DisplayName "llamacpp-exporter (Prometheus exporter for llama-server)"
nssm set $ServiceName Start SERVICE_AUTO_START
# Restart after every exit, 5 s later; on stop, Ctrl-C first (the exporter exits cleanly on it).
nssm set $ServiceName AppExit Default Restart
nssm set $ServiceName AppRestartDelay 5000
nssm set $ServiceName AppStopMethodConsole 5000
# The exporter's own log lines (stderr), rotated at 10 MB.
nssm set $ServiceName AppStdout (Join-Path $OutputDir "llamacpp-exporter.out.log")
nssm set $ServiceName AppStderr (Join-Path $OutputDir "llamacpp-exporter.err.log")
nssm set $ServiceName AppRotateFiles 1
nssm set $ServiceName AppRotateOnline 1
nssm set $ServiceName AppRotateBytes 10485760
nssm start $ServiceName
Write-Host "installed and started $ServiceName; metrics at http://$ListenAddress/metrics"
