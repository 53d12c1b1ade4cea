# llamacpp-exporter as a Windows Scheduled Task: started at boot, started again within a minute whenever
# it has exited, no extra software. Run in an elevated PowerShell (5.1 or 7):
#
#   powershell -ExecutionPolicy Bypass -File register-scheduled-task.ps1 -LogFile C:\llama\logs\llama-server.stderr
#
# It follows the file your wrapper writes llama-server's stderr to (the wrapper renames the last run's
# file to llama-server.stderr.prev-<time> before each restart: the exporter follows the new file by
# its path and counts each start). Stop it with Stop-ScheduledTask -TaskName llamacpp-exporter and
# remove it with Unregister-ScheduledTask -TaskName llamacpp-exporter.
param(
    [string]$Exe = "C:\llamacpp-exporter\venv\Scripts\llamacpp-exporter.exe",
    [string]$LogFile = "C:\llama\logs\llama-server.stderr",
    [string]$ServerUrl = "http://127.0.0.1:8080",
    [string]$ListenAddress = "127.0.0.1:9778",
    [string]$TaskName = "llamacpp-exporter"
)
$ErrorActionPreference = "Stop"

# One argument per line; a path with spaces is quoted for the command line the task runs.
$ExporterArgs = @(
    "--log-file", $LogFile,
    "--server-url", $ServerUrl,
    "--listen-address", $ListenAddress
)
$Argument = ($ExporterArgs | ForEach-Object { if ($_ -match '\s') { '"' + $_ + '"' } else { $_ } }) -join " "

$Action = New-ScheduledTaskAction -Execute $Exe -Argument $Argument -WorkingDirectory (Split-Path -Parent $Exe)
# At boot, and every minute from now on: a run that is still going is left alone (IgnoreNew), so the
# repetition only starts the exporter again after it has exited. (Task Scheduler's own "restart on
# failure" retries only a launch that failed, not a program that exited.)
$AtBoot = New-ScheduledTaskTrigger -AtStartup
$EveryMinute = New-ScheduledTaskTrigger -Once -At (Get-Date) -RepetitionInterval (New-TimeSpan -Minutes 1)
$Settings = New-ScheduledTaskSettingsSet `
    -MultipleInstances IgnoreNew `
    -ExecutionTimeLimit ([TimeSpan]::Zero) `
    -RestartCount 255 -RestartInterval (New-TimeSpan -Minutes 1) `
    -AllowStartIfOnBatteries -DontStopIfGoingOnBatteries -StartWhenAvailable
# SYSTEM reads every user's llama-server (its command line and LLAMA_* environment) and needs no password.
$Principal = New-ScheduledTaskPrincipal -UserId "SYSTEM" -LogonType ServiceAccount -RunLevel Highest

Register-ScheduledTask -TaskName $TaskName -Action $Action -Trigger @($AtBoot, $EveryMinute) `
    -Settings $Settings -Principal $Principal -Force | Out-Null
Start-ScheduledTask -TaskName $TaskName
Write-Host "registered and started $TaskName; metrics at http://$ListenAddress/metrics"
