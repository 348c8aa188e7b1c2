// The shared tests' way to run a command line tool (the openssl command line, chattr): what it
// returns and when it throws, since many tests' independent checks stand on it.
import Testing
import TokenBrokerTestSupport

@Suite struct CommandLineToolTests {
    @Test func standardOutputAndErrorAreReturnedTogether() throws {
        let text = try CommandLineTool.run("/bin/sh", ["-c", "printf 'out\\n'; printf 'err\\n' >&2"])
        #expect(text == "out\nerr\n")
    }

    @Test func aNonZeroExitThrowsWithWhatTheToolPrinted() {
        #expect {
            try CommandLineTool.run("/bin/sh", ["-c", "echo why; exit 3"])
        } throws: { error in
            "\(error)".contains("why") && "\(error)".contains("failed")
        }
    }

    @Test func aToolKilledByASignalThrows() {
        #expect(throws: CommandLineTool.Failure.self) {
            try CommandLineTool.run("/bin/sh", ["-c", "kill -9 $$"])
        }
    }

    @Test func aMissingToolThrows() {
        #expect(throws: CommandLineTool.Failure.self) {
            try CommandLineTool.run("/nonexistent/tool", [])
        }
    }

    @Test func outputLargerThanThePipesBufferIsReadWhole() throws {
        // 1 MiB: far more than a socket's buffer, so the tool blocks until it is read.
        let text = try CommandLineTool.run("/bin/sh", ["-c", "head -c 1048576 /dev/zero | tr '\\0' a"])
        #expect(text.utf8.count == 1_048_576)
        #expect(text.utf8.allSatisfy { $0 == UInt8(ascii: "a") })
    }
}
