// token-broker: the executable. Everything it does is in the files beside this one:
//   Options.swift          the command line
//   Broker.swift           wiring configuration, sources, providers and listeners; start and stop
//   BrokerReload.swift     reloading the configuration at SIGHUP or POST /reload, keeping what did not change
//   BrokerSinks.swift      token files: the directory check, one runner per sink, their logs and stop
//   ProviderLogging.swift  what providers and templates report, as log lines and metrics
//   Signals.swift          SIGTERM and SIGINT (stop) and SIGHUP (reload), blocked before any thread starts
//   Log.swift              log lines on stderr, with fingerprints instead of secrets
//   HealthCheck.swift      `token-broker healthcheck`, for container HEALTHCHECKs without curl
//   CommandLineClient.swift  `token-broker token` and `status`, for scripts and people
//   ReloadCommand.swift    `token-broker reload`, which asks the admin listener's POST /reload
//   ProcessLimits.swift    the open-file limit, and the start-up check of secret files' modes
//   Environment.swift      the environment variables, read from environ
//   AllocatorTuning.swift  glibc's malloc arenas: one, or one per libcurl loop more with proxies; before any thread starts
import Glibc

// Block the stop signals first, so every thread started later inherits the mask and only
// the main thread, in sigwait, ever sees them.
Signals.blockStopSignals()
AllocatorTuning.limitArenas(1)
exit(Options.run(arguments: Array(CommandLine.arguments.dropFirst())))
